"""Distilling a draft on a chat target's own replies (``target_replies.py``), with no teacher forward.

The replies corpus already holds, at every reply token, the target's K most likely tokens and
their log-probabilities. The loss at a reply position is the cross-entropy of the draft's q
against that truncated p (renormalised over the K tokens the draft can propose), which is
KL(p || q) up to a constant on those tokens; prompt positions only give context. A draft with
a reduced vocabulary (``vocab_draft``) is trained in its own ids.

Readouts on the held-out tail of the corpus (the last ``validation_share`` of replies):
greedy agreement (the draft's argmax is the target's reply token) and the greedy acceptance
length it implies at k drafts: since a greedy draft only keeps drafting while it agrees, the
i-th draft of a round always conditions on the target's own text, so one teacher-forced pass
gives exact per-round acceptance (``tau_from_hits``).

With ``eval_replies`` (the target's replies to an evaluation set written apart from the
training instructions, ``eval_set.py``), the same readout on them at the start and at every
checkpoint is the distillation curve: ``curve.json`` (and ``readouts.jsonl``, phase "curve").

Runs on a GPU when there is one (``device.py``). Layout of ``out``: checkpoint/ (resumable),
final/ (the draft, with its tokenizer and draft vocabulary), distill.log, readouts.jsonl,
curve.json, settings.json.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from edgespec.cloud.training.device import TrainingDevice, choose_device
from edgespec.cloud.training.loop import (
    Budget,
    Every,
    LRSchedule,
    RunLog,
    adamw,
    checkpoint_exists,
    configure_threads,
    load_trainer_state,
    save_checkpoint,
    train_loop,
)
from edgespec.cloud.training.target_replies import load_replies
from edgespec.cloud.training.draft_vocab import DRAFT_VOCAB_FILE, DraftVocab, load_draft_vocab


SETTINGS = "settings.json"  # the settings of the latest run in ``out``
CURVE = "curve.json"  # the evaluation set's readouts, one per checkpoint


@dataclass(frozen=True)
class RepliesDistillConfig:
    draft: Path  # the starting draft (e.g. vocab_draft.build_draft's output)
    replies: Path  # target_replies output
    out: Path
    minutes: float = 30.0
    tokens: int = 0  # budget in trained reply positions (0: none)
    batch_sequences: int = 8
    lr: float = 3e-4
    warmup_tokens: int = 20_000
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    validation_share: float = 0.03
    eval_minutes: float = 5.0
    checkpoint_minutes: float = 5.0
    k: int = 4
    seed: int = 0
    threads: int = 1
    bf16: bool = True  # on the CPU, autocast the draft's forward and backward to bfloat16 (fp32 weights)
    device: str = "auto"  # auto: the GPU if torch sees one (device.py)
    eval_replies: Path | None = None  # the target's replies to the evaluation set: the curve
    # Text the target reads teacher-forced (its top-K computed on the fly, in bfloat16): a share
    # of the steps train on windows of it. A forward over known text costs the target ~10x less
    # per token than writing replies, so it widens what the draft sees beyond the replies.
    text: Path | None = None  # .npy of target token ids (uint32), one long stream
    text_share: float = 0.0
    text_target: Path | None = None  # the target that reads it
    window_len: int = 256

    def __post_init__(self) -> None:
        for name in ("draft", "replies", "out"):
            object.__setattr__(self, name, Path(getattr(self, name)))
        if self.eval_replies is not None:
            object.__setattr__(self, "eval_replies", Path(self.eval_replies))
        if not 0 < self.validation_share < 0.5:
            raise ValueError(f"validation_share must be in (0, 0.5), got {self.validation_share}")
        for name in ("batch_sequences", "k", "threads", "window_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.text_share < 1:
            raise ValueError(f"text_share must be in [0, 1), got {self.text_share}")
        if self.text_share and (self.text is None or self.text_target is None):
            raise ValueError("text_share > 0 needs text (a token file) and text_target (the model that reads it)")


@dataclass
class Example:
    ids: torch.Tensor  # [L] draft ids: prompt then reply
    start: int  # position predicting the first reply token
    top_ids: torch.Tensor  # [n, K] draft ids of the target's top tokens
    top_weights: torch.Tensor  # [n, K] p renormalised over the tokens the draft has (0 elsewhere)
    reply: torch.Tensor  # [n] draft ids of the reply tokens


def load_examples(replies: Path, vocab: DraftVocab | None) -> list[Example]:
    table = vocab.target_to_draft() if vocab is not None else None
    inside = None
    if vocab is not None:
        inside = torch.zeros(vocab.target_vocab_size, dtype=torch.bool)
        inside[torch.tensor(vocab.draft_to_target)] = True
    examples = []
    for prompt, reply, top_ids, top_lps in load_replies(replies):
        if len(reply) == 0:
            continue
        ids = torch.from_numpy(np.concatenate([prompt, reply]).astype(np.int64))
        tops = torch.from_numpy(top_ids.astype(np.int64))
        weights = torch.from_numpy(top_lps.astype(np.float32)).exp()
        if table is not None and inside is not None:
            weights = weights * inside[tops]
            ids, tops = table[ids], table[tops]
        weights = weights / weights.sum(-1, keepdim=True).clamp_min(1e-9)
        examples.append(Example(ids, len(prompt) - 1, tops, weights, ids[len(prompt) :]))
    return examples


def tau_from_hits(hits: list[bool], k: int) -> tuple[int, int, list[int]]:
    """Greedy rounds over one reply: (rounds, committed tokens, rounds whose i-th draft was
    accepted). A round accepts the run of hits from its start (at most k) and commits one more."""
    rounds = committed = 0
    accepted_at = [0] * k
    t = 0
    while t + k + 1 <= len(hits):
        run = 0
        while run < k and hits[t + run]:
            accepted_at[run] += 1
            run += 1
        rounds += 1
        committed += run + 1
        t += run + 1
    return rounds, committed, accepted_at


@torch.inference_mode()
def teacher_examples(target, windows: torch.Tensor, top_k: int, table: torch.Tensor | None, inside: torch.Tensor | None) -> list[Example]:
    """Examples from windows [B, L] of known text read by the target: every position but the
    first is a prediction, against the target's top-K there."""
    logits = target(input_ids=windows).logits[:, :-1].float()
    values, tops = torch.log_softmax(logits, dim=-1).topk(top_k, dim=-1)
    windows, tops, weights = windows.cpu(), tops.cpu(), values.exp().cpu()  # examples live on the CPU
    out = []
    for b in range(windows.shape[0]):
        ids, top, w = windows[b], tops[b], weights[b]
        if table is not None and inside is not None:
            w = w * inside[top]
            ids, top = table[ids], table[top]
        w = w / w.sum(-1, keepdim=True).clamp_min(1e-9)
        out.append(Example(ids.clone(), 0, top.clone(), w.clone(), ids[1:].clone()))
    return out


def distillation_loss(model, batch: list[Example], bf16: bool, device: torch.device | None = None) -> tuple[torch.Tensor, int]:
    """The batch's loss (module docstring) on ``device`` (the CPU by default), in bfloat16
    autocast where ``bf16``, and how many reply positions it trained."""
    device = device or torch.device("cpu")
    longest = max(e.ids.numel() for e in batch)
    input_ids = torch.zeros(len(batch), longest, dtype=torch.long)
    for b, e in enumerate(batch):
        input_ids[b, : e.ids.numel()] = e.ids  # right padding: causal, later positions unseen
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        hidden = model.get_decoder()(input_ids=input_ids.to(device)).last_hidden_state
    rows = torch.cat([hidden[b, e.start : e.start + e.reply.numel()] for b, e in enumerate(batch)])
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = model.get_output_embeddings()(rows)
    logq = torch.log_softmax(logits.float(), dim=-1)
    tops = torch.cat([e.top_ids for e in batch]).to(device)
    weights = torch.cat([e.top_weights for e in batch]).to(device)
    loss = -(weights * logq.gather(1, tops)).sum(-1).mean()
    return loss, rows.shape[0]


@torch.no_grad()
def readout(model, examples: list[Example], k: int) -> dict:
    model.eval()
    device = next(model.parameters()).device
    hits_total = positions = rounds = committed = 0
    accepted_at = [0] * k
    for e in examples:
        logits = model(input_ids=e.ids[None].to(device)).logits[0, e.start : e.start + e.reply.numel()]
        hits = (logits.argmax(-1).cpu() == e.reply).tolist()
        hits_total += sum(hits)
        positions += len(hits)
        r, c, a = tau_from_hits(hits, k)
        rounds, committed = rounds + r, committed + c
        accepted_at = [x + y for x, y in zip(accepted_at, a)]
    model.train()
    return {
        "agreement": hits_total / max(positions, 1),
        "tau": committed / max(rounds, 1),
        "per_position": [round(a / max(rounds, 1), 4) for a in accepted_at],
        "positions": positions,
    }


class _TextSource:
    """Batches of teacher-forced windows of the text file (``config.text``), at random offsets
    drawn from the step number (a resumed run draws the same windows)."""

    def __init__(self, config: RepliesDistillConfig, vocab: DraftVocab | None, device: torch.device):
        self.config, self.device = config, device
        assert config.text is not None and config.text_target is not None  # checked by the config
        self.stream = torch.from_numpy(np.load(config.text).astype(np.int64))
        if self.stream.numel() <= config.window_len + 1:
            raise ValueError(f"{config.text} holds {self.stream.numel()} tokens, fewer than a window")
        target = cast(Any, AutoModelForCausalLM.from_pretrained(config.text_target, dtype=torch.bfloat16, local_files_only=True))
        self.target = target.to(device).eval()
        self.top_k = 32
        self.table = vocab.target_to_draft() if vocab is not None else None
        self.inside = None
        if vocab is not None:
            self.inside = torch.zeros(vocab.target_vocab_size, dtype=torch.bool)
            self.inside[torch.tensor(vocab.draft_to_target)] = True

    def batch(self, step: int) -> list[Example]:
        generator = torch.Generator().manual_seed(self.config.seed * 1_000_003 + step)
        length = self.config.window_len + 1
        starts = torch.randint(0, self.stream.numel() - length, (self.config.batch_sequences,), generator=generator)
        windows = torch.stack([self.stream[s : s + length] for s in starts.tolist()])
        return teacher_examples(self.target, windows.to(self.device), self.top_k, self.table, self.inside)


class _Curve:
    """The readout on the evaluation set's replies at the start and at every checkpoint,
    appended to ``curve.json`` (a resumed run carries the curve on)."""

    def __init__(self, out: Path, log: RunLog, examples: list[Example], k: int):
        self.path, self.log, self.examples, self.k = out / CURVE, log, examples, k
        self.points = json.loads(self.path.read_text()) if self.path.is_file() else []

    def point(self, model, state: dict) -> None:
        if not self.examples:
            return
        result = readout(model, self.examples, self.k)
        point = {"step": state["step"], "tokens": state["tokens"], "minutes": round(state["elapsed_s"] / 60, 2), **result}
        self.points = [p for p in self.points if p["step"] != point["step"]] + [point]
        self.path.write_text(json.dumps(self.points, indent=1) + "\n")
        self.log(f"eval set at step {point['step']} ({point['minutes']} min): agreement {result['agreement']:.4f} "
                 f"tau {result['tau']:.3f} by position {result['per_position']}", phase="curve", **point)


def distill_on_replies(config: RepliesDistillConfig) -> dict:
    configure_threads(config.threads)
    hf_logging.set_verbosity_error()
    out = config.out
    out.mkdir(parents=True, exist_ok=True)
    log = RunLog(out, "distill.log", "readouts.jsonl")
    (out / SETTINGS).write_text(json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()}, indent=1))
    checkpoint = out / "checkpoint"
    resume = checkpoint_exists(checkpoint)
    source = checkpoint if resume else config.draft
    device = choose_device(config.device, bf16=config.bf16)
    log(f"distill on {device.describe()}")
    model = cast(Any, AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, local_files_only=True))
    model = model.to(device.device).train()
    vocab = load_draft_vocab(config.draft)
    examples = load_examples(config.replies, vocab)
    random.Random(config.seed).shuffle(examples)
    if len(examples) < 2:
        raise ValueError(f"{config.replies} holds {len(examples)} replies: run the replies stage first")
    n_val = min(len(examples) // 2, max(8, int(len(examples) * config.validation_share)))
    validation, train = examples[:n_val], examples[n_val:]
    train.sort(key=lambda e: e.ids.numel())  # similar lengths batch together: little padding
    batches = [train[i : i + config.batch_sequences] for i in range(0, len(train), config.batch_sequences)]
    log(f"distill on replies: {len(train)} train, {len(validation)} validation replies, "
        f"{sum(e.reply.numel() for e in train)} train reply tokens, {len(batches)} batches; resume={resume}")
    optimizer = adamw(model, config.lr, config.weight_decay)
    state = load_trainer_state(checkpoint, optimizer) if resume else {"step": 0, "tokens": 0, "elapsed_s": 0.0}
    curve = _Curve(out, log, load_examples(config.eval_replies, vocab) if config.eval_replies else [], config.k)
    if not resume:
        log("readout before training", **{"phase": "start", **readout(model, validation, config.k)})
        curve.point(model, state)
    order = list(range(len(batches)))
    text_source = _TextSource(config, vocab, device.device) if config.text_share else None
    text_every = round(1 / config.text_share) if config.text_share else 0
    bf16 = device.autocast is torch.bfloat16

    def step_loss(step: int):
        if text_source is not None and step % text_every == text_every - 1:
            return distillation_loss(model, text_source.batch(step), bf16, device.device)
        epoch, index = divmod(step, len(order))
        if index == 0:
            random.Random(config.seed + epoch).shuffle(order)
        return distillation_loss(model, batches[order[index]], bf16, device.device)

    def evaluate() -> None:
        log(f"readout at step {state['step']}", **{"phase": "train", "step": state["step"], "tokens": state["tokens"],
                                                    **readout(model, validation, config.k)})

    def save() -> None:
        save_checkpoint(checkpoint, model, optimizer, state, tokenizer_dir=config.draft)
        curve.point(model, state)

    losses: list[float] = []

    def on_step(loss: float, lr: float) -> None:
        losses.append(loss)
        if len(losses) == 50:
            log(f"step {state['step']} loss {sum(losses) / 50:.4f} lr {lr:.2e} tokens {state['tokens']}")
            losses.clear()

    train_loop(
        model, optimizer, state,
        budget=Budget(tokens=config.tokens, minutes=config.minutes),
        schedule=LRSchedule(config.lr, config.warmup_tokens, config.min_lr_ratio),
        step_loss=step_loss, on_step=on_step, desc="distill",
        every=[Every(config.eval_minutes, evaluate), Every(config.checkpoint_minutes, save)],
    )
    save()
    final = readout(model, validation, config.k)
    log("readout at the end", **{"phase": "end", "step": state["step"], "tokens": state["tokens"], **final})
    final_dir = out / "final"
    shutil.rmtree(final_dir, ignore_errors=True)
    shutil.copytree(checkpoint, final_dir, ignore=shutil.ignore_patterns("optimizer.pt", "trainer_state.json"))
    if (config.draft / DRAFT_VOCAB_FILE).is_file():
        shutil.copyfile(config.draft / DRAFT_VOCAB_FILE, final_dir / DRAFT_VOCAB_FILE)
    return {"final": str(final_dir), **final, "step": state["step"], "tokens": state["tokens"]}
