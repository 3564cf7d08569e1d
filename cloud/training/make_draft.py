"""Making a draft for a real chat target (``edgespec make-draft``): the real reference pair.

Stages, in order (``--stages`` picks a subset; every stage resumes or skips finished work):

  prompts  the instruction sets (``instructions.py``): training instructions, and the
           held-out and tuning prompt sets written to ``prompts/chat-*.jsonl``
  replies  the target's greedy replies to the training instructions with its top-K at each
           token (``target_replies.py``; resumable chunks, the long stage)
  draft    the draft vocabulary (the ``vocab_size`` tokens most frequent in the replies and
           prompts, plus every special token) and the draft cut from the target: its embedding
           rows for that vocabulary and ``layers`` of its decoder layers (``vocab_draft.py``)
  distill  train the whole draft on the replies against the target's top-K, and on windows of
           the stdlib's source and documentation that the target reads teacher-forced
           (``distill_replies.py``)
  export   the distilled draft to ONNX for the device, fp32 and int8
  eval     on the held-out prompts: the target's own (float32) greedy replies, the draft's
           greedy agreement, simulated tau at k with and without context lookup, acceptance by
           position; ms per drafted token (ONNX Runtime, fp32 and int8) vs one target decode
           step (torch), one thread each
  ship     the small artefacts (draft HF weights in fp16, the int8 ONNX draft, metrics, the
           model card) into ``--ship``

Layout under ``--out``: replies/, draft-init/, distill/, export/, eval/metrics.json.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

STAGES = ("prompts", "replies", "draft", "distill", "export", "eval", "ship")


@dataclass(frozen=True)
class MakeDraftConfig:
    target: Path
    out: Path = Path("runs/smollm2")
    ship: Path = Path("models/smollm2-135m")
    prompts: Path = Path("prompts")
    stages: tuple[str, ...] = STAGES
    threads: int = 1
    replies: int = 6144
    replies_minutes: float = 55.0
    replies_batch: int = 96
    max_new_tokens: int = 192
    vocab_size: int = 8192
    layers: tuple[int, ...] = (0, 1, 2)
    distill_minutes: float = 45.0
    distill_lr: float = 1e-3
    text_share: float = 0.5  # of distillation steps on teacher-forced stdlib text (stage_text)
    text_tokens: int = 4_000_000
    eval_prompts: int = 48
    eval_new_tokens: int = 128
    k: int = 4

    def __post_init__(self) -> None:
        for name in ("target", "out", "ship", "prompts"):
            object.__setattr__(self, name, Path(getattr(self, name)))
        unknown = [s for s in self.stages if s not in STAGES]
        if unknown or not self.stages:
            raise ValueError(f"stages must be a non-empty subset of {','.join(STAGES)}, got {','.join(self.stages)}")
        if not (self.target / "config.json").is_file():
            raise ValueError(f"target: {self.target} is not a Hugging Face model directory (no config.json); "
                             "import one with `edgespec import-gguf`")
        for name in ("threads", "replies", "replies_batch", "max_new_tokens", "vocab_size", "eval_prompts", "eval_new_tokens", "k"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.layers:
            raise ValueError("layers must name at least one of the target's layers")

    @property
    def heldout_prompts(self) -> Path:
        return self.prompts / "chat-heldout.jsonl"


def _log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} make-draft: {message}", file=sys.stderr, flush=True)


def stage_prompts(config: MakeDraftConfig) -> list:
    from edgespec.cloud.training.instructions import instruction_sets, write_prompt_set

    sets = instruction_sets()
    for name in ("heldout", "tuning"):
        write_prompt_set(config.prompts / f"chat-{name}.jsonl", sets[name])
    _log(f"prompts: {len(sets['train'])} training instructions; held-out and tuning sets in {config.prompts}")
    return sets["train"]


def stage_replies(config: MakeDraftConfig, train) -> None:
    from edgespec.cloud.training.target_replies import RepliesConfig, generate_replies

    replies = RepliesConfig(target=config.target, out_dir=config.out / "replies", replies=config.replies,
                            minutes=config.replies_minutes, batch=config.replies_batch,
                            max_new_tokens=config.max_new_tokens, threads=config.threads)
    _log(f"replies: {generate_replies(replies, [(i.id, i.text) for i in train], log=_log)}")


def stage_draft(config: MakeDraftConfig) -> None:
    from transformers import AutoTokenizer

    from edgespec.cloud.training.target_replies import load_replies
    from edgespec.edge.eos import eos_token_ids
    from edgespec.cloud.training.vocab_draft import build_draft, choose_vocab, special_ids

    tokenizer = AutoTokenizer.from_pretrained(config.target, local_files_only=True)
    counts: Counter = Counter()
    for prompt, reply, _, _ in load_replies(config.out / "replies"):
        counts.update(reply.tolist())
        counts.update(prompt.tolist())
    if not counts:
        raise SystemExit("make-draft: no replies yet: run the replies stage first")
    unknown = tokenizer.unk_token_id if tokenizer.unk_token_id is not None else eos_token_ids(config.target)[0]
    vocab = choose_vocab(counts, config.vocab_size, always=special_ids(tokenizer) + eos_token_ids(config.target),
                         unknown=unknown, target_vocab_size=len(tokenizer))
    covered = sum(c for t, c in counts.items() if t in set(vocab.draft_to_target)) / sum(counts.values())
    out = build_draft(config.target, vocab, list(config.layers), config.out / "draft-init")
    (out / "vocab_stats.json").write_text(json.dumps({"vocab_size": vocab.draft_vocab_size, "coverage_of_training_text": covered,
                                                      "distinct_tokens_seen": len(counts)}))
    _log(f"draft: {vocab.draft_vocab_size} tokens cover {covered:.4f} of the training text; layers {list(config.layers)} -> {out}")


def stage_text(config: MakeDraftConfig) -> Path:
    """The text the target reads teacher-forced during distillation: the training split of
    the stdlib's source and its rendered documentation (``pydoc_data/topics.py``: English
    about Python), in the target's ids, up to ``text_tokens`` tokens."""
    import numpy as np
    from transformers import AutoTokenizer

    from edgespec.cloud.training.corpus import list_corpus, read_source, stdlib_root

    path = config.out / "text.npy"
    if path.is_file():
        return path
    tokenizer = AutoTokenizer.from_pretrained(config.target, local_files_only=True)
    root = stdlib_root()
    sources = [root / "pydoc_data" / "topics.py"] + [root / f.relpath for f in list_corpus(root) if f.split == "train"]
    ids: list[int] = []
    for source in sources:
        text = read_source(source) if source.is_file() else None
        if text:
            ids += tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) >= config.text_tokens:
            break
    np.save(path, np.asarray(ids[: config.text_tokens], dtype=np.uint32))
    _log(f"text: {min(len(ids), config.text_tokens)} tokens of stdlib source and documentation -> {path}")
    return path


def stage_distill(config: MakeDraftConfig) -> None:
    from edgespec.cloud.training.distill_replies import RepliesDistillConfig, distill_on_replies

    text = stage_text(config) if config.text_share else None
    result = distill_on_replies(RepliesDistillConfig(
        draft=config.out / "draft-init", replies=config.out / "replies", out=config.out / "distill",
        minutes=config.distill_minutes, lr=config.distill_lr, warmup_tokens=5_000, k=config.k, threads=config.threads,
        text=text, text_share=config.text_share, text_target=config.target))
    _log(f"distill: {result}")


def stage_export(config: MakeDraftConfig) -> None:
    from edgespec.cloud.training.export import export_draft

    source = config.out / "distill" / "final"
    for name, quantize in (("fp32", None), ("int8", "int8")):
        export_draft(source, config.out / "export" / name, overwrite=True, quantize=quantize, target_dir=config.target,
                     log=_log)
        _log(f"export: {name} -> {config.out / 'export' / name}")


def _eval_texts(config: MakeDraftConfig, target):
    """The held-out prompts and the target's own float32 greedy replies to them."""
    from transformers import AutoTokenizer

    from edgespec.cloud.training.target_replies import chat_ids, reply_batch
    from edgespec.edge.eos import eos_token_ids

    tokenizer = AutoTokenizer.from_pretrained(config.target, local_files_only=True)
    stop = eos_token_ids(config.target)
    rows = [json.loads(line) for line in config.heldout_prompts.read_text().splitlines() if line.strip()][: config.eval_prompts]
    prompts = [chat_ids(tokenizer, row["prompt"]) for row in rows]
    replies = []
    for start in range(0, len(prompts), 16):
        batch = prompts[start : start + 16]
        replies += [r for r, _, _ in reply_batch(target, batch, max_new_tokens=config.eval_new_tokens, stop=stop, top_k=1, pad=stop[0])]
    return prompts, replies


def _draft_ms(draft_dir: Path, context: list[int], k: int, rounds: int = 40) -> float:
    from edgespec.edge.draft import DraftModel

    draft = DraftModel(draft_dir, threads=1)
    times = []
    for _ in range(3):
        draft.reset(context)
        draft.propose(1)
        draft.rollback_to(len(context))
        started = time.perf_counter()
        for _ in range(rounds):
            draft.propose(k)
            draft.rollback_to(len(context))
        times.append((time.perf_counter() - started) * 1e3 / (rounds * k))
    return statistics.median(times)


def _target_step_ms(target, context: list[int], steps: int = 20) -> float:
    import torch

    with torch.inference_mode():
        out = target(input_ids=torch.tensor([context]), use_cache=True)
        cache, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        started = time.perf_counter()
        for _ in range(steps):
            out = target(input_ids=token, cache=cache, use_cache=True)
            cache, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    return (time.perf_counter() - started) * 1e3 / steps


def _onnx_acceptance(draft_dir: Path, prompts, replies, k: int) -> dict:
    """Greedy agreement and model-only tau of an exported graph on the replies: a greedy draft
    keeps drafting only while it agrees, so one teacher-forced pass gives each round exactly."""
    from edgespec.cloud.training.distill_replies import tau_from_hits
    from edgespec.edge.draft import DraftModel

    draft = DraftModel(draft_dir, threads=1)
    hits_total = positions = rounds = committed = 0
    accepted_at = [0] * k
    for prompt, reply in zip(prompts, replies):
        logits = draft.logits_for_context(prompt + reply[:-1])[len(prompt) - 1 :]
        hits = [int(a) == int(b) for a, b in zip(logits.argmax(-1), reply)]
        hits_total, positions = hits_total + sum(hits), positions + len(hits)
        r, c, a = tau_from_hits(hits, k)
        rounds, committed = rounds + r, committed + c
        accepted_at = [x + y for x, y in zip(accepted_at, a)]
    return {"greedy_agreement": hits_total / max(positions, 1), "tau": committed / max(rounds, 1),
            "acceptance_by_position": [a / max(rounds, 1) for a in accepted_at], "rounds": rounds}


def stage_eval(config: MakeDraftConfig) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from edgespec.cloud.training.simulate_acceptance import Acceptance, simulate_greedy
    from edgespec.cloud.training.loop import configure_threads
    from edgespec.cloud.training.vocab_draft import load_draft
    from edgespec.edge.lookup import LookupConfig

    configure_threads(config.threads)
    target = AutoModelForCausalLM.from_pretrained(config.target, dtype=torch.float32, local_files_only=True).eval()
    prompts, replies = _eval_texts(config, target)
    graphs = {name: _onnx_acceptance(config.out / "export" / name, prompts, replies, config.k) for name in ("fp32", "int8")}
    draft = load_draft(config.out / "distill" / "final")
    with_lookup = Acceptance(config.k)  # the device's greedy drafting: the model and context lookup
    with torch.no_grad():
        for prompt, reply in zip(prompts, replies):
            simulate_greedy(draft, torch.tensor(prompt), torch.tensor(reply), config.k, with_lookup, LookupConfig())
    context = prompts[0] + replies[0]
    costs = {name: _draft_ms(config.out / "export" / name, context, config.k) for name in ("fp32", "int8")}
    target_ms = _target_step_ms(target, context)
    metrics = {
        "prompts": len(prompts), "reply_tokens": sum(len(r) for r in replies), "k": config.k,
        "onnx": graphs,
        "tau_with_lookup": with_lookup.tau, "acceptance_by_position_with_lookup": with_lookup.per_position,
        "draft_ms_per_token": costs, "target_decode_step_ms": target_ms,
        "draft_cost_vs_target_step": {name: ms / target_ms for name, ms in costs.items()},
    }
    (config.out / "eval").mkdir(parents=True, exist_ok=True)
    (config.out / "eval" / "metrics.json").write_text(json.dumps(metrics, indent=1))
    _log(f"eval: {json.dumps(metrics)}")
    return metrics


def make_draft(config: MakeDraftConfig) -> None:
    config.out.mkdir(parents=True, exist_ok=True)
    with open(config.out / "make_draft_invocations.jsonl", "a") as f:
        f.write(json.dumps({"time": time.time(), "argv": sys.argv, "config": {k: str(v) for k, v in asdict(config).items()}}) + "\n")
    train = stage_prompts(config) if {"prompts", "replies"} & set(config.stages) else None
    if "replies" in config.stages:
        stage_replies(config, train)
    if "draft" in config.stages:
        stage_draft(config)
    if "distill" in config.stages:
        stage_distill(config)
    if "export" in config.stages:
        stage_export(config)
    if "eval" in config.stages:
        stage_eval(config)
    if "ship" in config.stages:
        from edgespec.cloud.training.make_draft_ship import ship_real_pair

        ship_real_pair(config)
