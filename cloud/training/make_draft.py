"""Making a draft for a chat target (``edgespec make-draft``): any local chat model a user brings.

Stages, in order (``--stages`` picks a subset; every stage resumes or skips finished work, so a
run stopped at any point, in any session, goes on where it stopped):

  prompts  the instruction sets (``instructions.py`` and ``chat_requests.py``): training
           instructions, and the held-out and tuning prompt sets written to ``prompts/chat-*.jsonl``;
           refused while the evaluation set (``eval_set.py``) occurs in them
  replies  the target's greedy replies to the training instructions with its top-K at each
           token (``target_replies.py``; resumable chunks, the long stage), and its replies to the
           evaluation set (``eval-replies/``), prompted with the target's own chat template and
           ended at its end tokens (``chat_format.py``)
  draft    the draft vocabulary (the ``vocab_size`` tokens most frequent in the replies and
           prompts, plus every special token) and the draft cut from the target: its embedding
           rows for that vocabulary and its first ``draft_layers`` decoder layers
           (``vocab_draft.py``); or a copy of an existing draft to train further (``from_draft``)
  distill  train the whole draft on the replies against the target's top-K, and on windows of
           the stdlib's source and documentation that the target reads teacher-forced
           (``distill_replies.py``), with the evaluation set's readout at every checkpoint
           (the distillation curve, ``distill/curve.json``)
  export   the distilled draft to ONNX for the device, fp32 and int8
  eval     on the held-out prompts: the target's own (float32) greedy replies, the draft's
           greedy agreement, simulated tau at k with and without context lookup, acceptance by
           position; ms per drafted token (ONNX Runtime, fp32 and int8) vs one target decode
           step (torch), one thread each (``make_draft_eval.py``)
  ship     the small artefacts (draft HF weights in fp16, the int8 ONNX draft, metrics, the
           model card) into ``--ship`` (``make_draft_ship.py``)

Training and the target's replies run on a GPU when torch sees one (``device.py``).
Layout under ``--out``: replies/, eval-replies/, draft-init/, distill/, export/, eval/metrics.json.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

STAGES = ("prompts", "replies", "draft", "distill", "export", "eval", "ship")


@dataclass(frozen=True)
class MakeDraftConfig:
    target: Path
    out: Path = Path("runs/make-draft")
    ship: Path | None = None  # None: <out>/ship
    prompts: Path = Path("prompts")
    stages: tuple[str, ...] = STAGES
    chat_template: Path | None = None  # a Jinja file, for a target that ships none
    device: str = "auto"  # auto: the GPU if torch sees one
    eval_set: Path | None = None  # None: <prompts>/chat-eval.jsonl (frozen, eval_set.py)
    threads: int = 1
    replies: int = 6144
    replies_minutes: float = 55.0
    replies_batch: int = 96
    requests: int = 4096  # composed chat requests among the training instructions (chat_requests.py)
    max_new_tokens: int = 192
    vocab_size: int = 8192
    draft_layers: int = 3  # the target's first layers the draft starts from (``layers`` overrides)
    layers: tuple[int, ...] = ()
    from_draft: Path | None = None  # train this draft further instead of cutting a new one
    distill_minutes: float = 45.0
    distill_lr: float = 1e-3
    text_share: float = 0.5  # of distillation steps on teacher-forced stdlib text (stage_text)
    text_tokens: int = 4_000_000
    eval_prompts: int = 48
    eval_new_tokens: int = 128
    k: int = 4

    def __post_init__(self) -> None:
        for name in ("target", "out", "prompts"):
            object.__setattr__(self, name, Path(getattr(self, name)))
        object.__setattr__(self, "ship", Path(self.ship) if self.ship is not None else self.out / "ship")
        object.__setattr__(self, "eval_set", Path(self.eval_set) if self.eval_set is not None else self.prompts / "chat-eval.jsonl")
        unknown = [s for s in self.stages if s not in STAGES]
        if unknown or not self.stages:
            raise ValueError(f"stages must be a non-empty subset of {','.join(STAGES)}, got {','.join(self.stages)}")
        if not (self.target / "config.json").is_file():
            raise ValueError(f"target: {self.target} is not a Hugging Face model directory (no config.json); "
                             "import one with `edgespec import-gguf`")
        for name in ("threads", "replies", "replies_batch", "max_new_tokens", "vocab_size", "draft_layers", "eval_prompts",
                     "eval_new_tokens", "k"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        target_layers = _text_config(self.target).get("num_hidden_layers")
        if isinstance(target_layers, int) and max(self.draft_layer_indices) >= target_layers:
            raise ValueError(f"layers: the target has {target_layers} decoder layers, the draft asks for "
                             f"{list(self.draft_layer_indices)}; pass --draft-layers below {target_layers}")
        if self.from_draft is not None and not (Path(self.from_draft) / "config.json").is_file():
            raise ValueError(f"from_draft: {self.from_draft} is not a Hugging Face model directory (no config.json)")

    @property
    def draft_layer_indices(self) -> tuple[int, ...]:
        return self.layers or tuple(range(self.draft_layers))

    @property
    def heldout_prompts(self) -> Path:
        return self.prompts / "chat-heldout.jsonl"


def _text_config(target: Path) -> dict:
    config = json.loads((target / "config.json").read_text())
    return config.get("text_config") or config


def _log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} make-draft: {message}", file=sys.stderr, flush=True)


def _eval_rows(config: MakeDraftConfig) -> list[dict]:
    from edgespec.cloud.training.eval_set import load_eval_set

    assert config.eval_set is not None  # set by the config
    return load_eval_set(config.eval_set, config.out)


def refuse_contamination(eval_rows: list[dict], training_texts, where: str) -> None:
    from edgespec.cloud.training.eval_set import contamination

    found = contamination(eval_rows, training_texts)
    if found:
        raise SystemExit(f"make-draft: {len(found)} evaluation prompts occur in {where} ({', '.join(found[:5])}): "
                         "a figure on them would measure memory; remove them from the training instructions")


def stage_prompts(config: MakeDraftConfig) -> list:
    from edgespec.cloud.training.eval_set import user_texts
    from edgespec.cloud.training.instructions import instruction_sets, write_prompt_set

    sets = instruction_sets(requests=config.requests)
    refuse_contamination(_eval_rows(config), (t for i in sets["train"] for t in user_texts(i.messages)),
                         "the training instructions")
    for name in ("heldout", "tuning"):
        write_prompt_set(config.prompts / f"chat-{name}.jsonl", sets[name])
    kinds = Counter(i.kind for i in sets["train"][: config.replies])
    _log(f"prompts: {len(sets['train'])} training instructions (the first {config.replies}: {dict(kinds)}); "
         f"none occurs in {config.eval_set}; held-out and tuning sets in {config.prompts}")
    return sets["train"]


def stage_replies(config: MakeDraftConfig, train) -> None:
    from edgespec.cloud.training.target_replies import RepliesConfig, generate_replies

    common: dict[str, Any] = dict(target=config.target, max_new_tokens=config.max_new_tokens, threads=config.threads, device=config.device,
                  chat_template=config.chat_template)
    evaluation = RepliesConfig(out_dir=config.out / "eval-replies", replies=10_000, batch=16, dtype="float32", **common)
    rows = _eval_rows(config)
    _log(f"replies to the evaluation set: {generate_replies(evaluation, [(r['id'], r['messages']) for r in rows], log=_log)}")
    replies = RepliesConfig(out_dir=config.out / "replies", replies=config.replies, minutes=config.replies_minutes,
                            batch=config.replies_batch, **common)
    _log(f"replies: {generate_replies(replies, [(i.id, i.messages) for i in train], log=_log)}")


def _reply_counts(config: MakeDraftConfig) -> Counter:
    from edgespec.cloud.training.target_replies import load_replies

    counts: Counter = Counter()
    for prompt, reply, _, _ in load_replies(config.out / "replies"):
        counts.update(reply.tolist())
        counts.update(prompt.tolist())
    if not counts:
        raise SystemExit("make-draft: no replies yet: run the replies stage first")
    return counts


def stage_draft(config: MakeDraftConfig) -> None:
    from transformers import AutoTokenizer

    from edgespec.cloud.training.chat_format import chat_format
    from edgespec.cloud.training.draft_vocab import load_draft_vocab
    from edgespec.cloud.training.vocab_draft import build_draft, choose_vocab, copy_draft, special_ids

    out = config.out / "draft-init"
    if (out / "config.json").is_file():
        _log(f"draft: {out} exists, kept (distillation resumes from it; delete it to cut another)")
        return
    tokenizer = AutoTokenizer.from_pretrained(config.target, local_files_only=True)
    counts = _reply_counts(config)
    if config.from_draft is not None:
        vocab = load_draft_vocab(config.from_draft)
        copy_draft(config.from_draft, config.target, out)
        what = f"a copy of {config.from_draft}"
    else:
        stop = list(chat_format(config.target, tokenizer, config.chat_template).stop_ids)
        unknown = tokenizer.unk_token_id if tokenizer.unk_token_id is not None else stop[0]
        vocab = choose_vocab(counts, config.vocab_size, always=special_ids(tokenizer) + stop, unknown=unknown,
                             target_vocab_size=len(tokenizer))
        build_draft(config.target, vocab, list(config.draft_layer_indices), out)
        what = f"layers {list(config.draft_layer_indices)} of the target"
    inside = set(vocab.draft_to_target) if vocab is not None else set(counts)
    covered = sum(c for t, c in counts.items() if t in inside) / sum(counts.values())
    size = vocab.draft_vocab_size if vocab is not None else len(tokenizer)
    (out / "vocab_stats.json").write_text(json.dumps({"vocab_size": size, "coverage_of_training_text": covered,
                                                      "distinct_tokens_seen": len(counts)}))
    _log(f"draft: {what}; {size} tokens cover {covered:.4f} of the training text -> {out}")


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


def _check_corpus(config: MakeDraftConfig) -> None:
    """The replies corpus, whichever generator made it, holds no evaluation prompt."""
    from transformers import AutoTokenizer

    from edgespec.cloud.training.target_replies import load_replies

    tokenizer = AutoTokenizer.from_pretrained(config.target, local_files_only=True)
    prompts = (tokenizer.decode(prompt.tolist(), skip_special_tokens=True) for prompt, _, _, _ in load_replies(config.out / "replies"))
    refuse_contamination(_eval_rows(config), prompts, f"the prompts of {config.out / 'replies'}")


def stage_distill(config: MakeDraftConfig) -> None:
    from edgespec.cloud.training.distill_replies import CURVE, RepliesDistillConfig, distill_on_replies

    _check_corpus(config)
    text = stage_text(config) if config.text_share else None
    eval_replies = config.out / "eval-replies"
    result = distill_on_replies(RepliesDistillConfig(
        draft=config.out / "draft-init", replies=config.out / "replies", out=config.out / "distill",
        minutes=config.distill_minutes, lr=config.distill_lr, warmup_tokens=5_000, k=config.k, threads=config.threads,
        text=text, text_share=config.text_share, text_target=config.target, device=config.device,
        eval_replies=eval_replies if eval_replies.is_dir() else None))
    _log(f"distill: {result}")
    curve_path = config.out / "distill" / CURVE
    if curve_path.is_file():
        _log(f"the distillation curve on {config.eval_set} ({curve_path}):")
        for point in json.loads(curve_path.read_text()):
            _log(f"  step {point['step']:>6} {point['minutes']:>7.1f} min  agreement {point['agreement']:.4f}  "
                 f"tau {point['tau']:.3f}  by position {point['per_position']}")


def stage_export(config: MakeDraftConfig) -> None:
    from edgespec.cloud.training.export import export_draft

    source = config.out / "distill" / "final"
    for name, quantize in (("fp32", None), ("int8", "int8")):
        graph = config.out / "export" / name / "model.onnx"
        if graph.is_file() and graph.stat().st_mtime > (source / "model.safetensors").stat().st_mtime:
            _log(f"export: {graph} is newer than {source}, kept")
            continue
        export_draft(source, config.out / "export" / name, overwrite=True, quantize=quantize, target_dir=config.target,
                     log=_log)
        _log(f"export: {name} -> {config.out / 'export' / name}")


def make_draft(config: MakeDraftConfig) -> None:
    from edgespec.cloud.training.chat_format import chat_format
    from edgespec.cloud.training.device import choose_device

    config.out.mkdir(parents=True, exist_ok=True)
    with open(config.out / "make_draft_invocations.jsonl", "a") as f:
        f.write(json.dumps({"time": time.time(), "argv": sys.argv, "config": {k: str(v) for k, v in asdict(config).items()}}) + "\n")
    form = chat_format(config.target, template_file=config.chat_template)  # refuses a target without a chat template
    _log(f"training on {choose_device(config.device).describe()}; the target's replies end at {list(form.stop_ids)} "
         f"(end of turn {form.end_of_turn}); stages {','.join(config.stages)} in {config.out}")
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
        from edgespec.cloud.training.make_draft_eval import stage_eval

        stage_eval(config, _log)
    if "ship" in config.stages:
        from edgespec.cloud.training.make_draft_ship import ship_draft

        ship_draft(config)
