"""The one training loop (``train_loop``), its budgeted LR schedule and resumable checkpoints.

Pretraining (``edgespec.cloud.demo.pretrain``) and distillation (``distill.py``) differ only in
the loss of a step and in what they do on their wall-clock intervals; both run ``train_loop``.

The schedule knows its budget up front (tokens, wall-clock minutes, or both); progress is the
larger of the two fractions, so a run on a busier machine than planned still decays its LR to
the floor exactly when it stops instead of being cut off at a high LR. With only a token
budget, runs are reproducible step for step.

A checkpoint is a directory written next to its final place and renamed into it, so a run
killed mid-write leaves the previous checkpoint intact.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
from tqdm import tqdm

STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.pt"


@dataclass(frozen=True)
class Budget:
    tokens: int = 0  # 0: no token budget
    minutes: float = 0.0  # 0: no time budget

    def __post_init__(self) -> None:
        if self.tokens < 0:
            raise ValueError(f"tokens must be >= 0, got {self.tokens}")
        if self.minutes < 0:
            raise ValueError(f"minutes must be >= 0, got {self.minutes}")
        if not self.tokens and not self.minutes:
            raise ValueError("a budget needs tokens or minutes (or both)")

    def progress(self, tokens: int, elapsed_s: float) -> float:
        fractions = []
        if self.tokens:
            fractions.append(tokens / self.tokens)
        if self.minutes:
            fractions.append(elapsed_s / (60.0 * self.minutes))
        return min(1.0, max(fractions))


@dataclass(frozen=True)
class LRSchedule:
    """Linear warmup (over tokens), then cosine decay over budget progress to ``min_ratio``."""

    peak: float
    warmup_tokens: int
    min_ratio: float = 0.1

    def __post_init__(self) -> None:
        if self.peak <= 0:
            raise ValueError(f"peak must be > 0, got {self.peak}")
        if self.warmup_tokens < 0:
            raise ValueError(f"warmup_tokens must be >= 0, got {self.warmup_tokens}")
        if not 0 <= self.min_ratio <= 1:
            raise ValueError(f"min_ratio must be in [0, 1], got {self.min_ratio}")

    def lr(self, tokens: int, progress: float) -> float:
        warm = min(1.0, (tokens + 1) / self.warmup_tokens) if self.warmup_tokens else 1.0
        cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return self.peak * warm * (self.min_ratio + (1.0 - self.min_ratio) * cosine)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def save_checkpoint(out_dir: Path, model, optimizer: torch.optim.Optimizer | None, state: dict, tokenizer_dir: Path | None = None) -> None:
    """Writes ``model`` (HF dir, safetensors), optimizer and trainer state atomically to ``out_dir``."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    old = out_dir.with_name(out_dir.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp))
    if tokenizer_dir is not None:
        for path in Path(tokenizer_dir).iterdir():
            if path.is_file() and path.name not in ("config.json", "model.safetensors", "generation_config.json"):
                shutil.copyfile(path, tmp / path.name)
    if optimizer is not None:
        torch.save(optimizer.state_dict(), tmp / OPTIMIZER_FILE)
    (tmp / STATE_FILE).write_text(json.dumps({**state, "saved_at": time.time()}, indent=1) + "\n")
    shutil.rmtree(old, ignore_errors=True)
    if out_dir.exists():
        out_dir.rename(old)
    tmp.rename(out_dir)
    shutil.rmtree(old, ignore_errors=True)


def checkpoint_exists(out_dir: Path) -> bool:
    return (Path(out_dir) / STATE_FILE).is_file()


def load_trainer_state(out_dir: Path, optimizer: torch.optim.Optimizer | None) -> dict:
    """Loads the optimizer state (model weights are loaded with from_pretrained) and returns the trainer state."""
    out_dir = Path(out_dir)
    if optimizer is not None and (out_dir / OPTIMIZER_FILE).is_file():
        optimizer.load_state_dict(torch.load(out_dir / OPTIMIZER_FILE, weights_only=True))
    return json.loads((out_dir / STATE_FILE).read_text())


def configure_threads(threads: int) -> None:
    # NOTE: on 2 shared cores, 2 intra-op threads collapse when another process is busy
    # (measured 1 ms -> 130-260 ms per token); one thread per job is the safe default.
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # already set once in this process


class RunLog:
    """A training run's log: one line per message in ``text_name``, one JSON record in ``jsonl_name``."""

    def __init__(self, out_dir: Path, text_name: str, jsonl_name: str) -> None:
        self.text = (Path(out_dir) / text_name).open("a", buffering=1)
        self.jsonl = (Path(out_dir) / jsonl_name).open("a", buffering=1)

    def __call__(self, message: str, **record) -> None:
        line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}"
        self.text.write(line + "\n")
        tqdm.write(line, file=sys.stderr)
        if record:
            self.jsonl.write(json.dumps({"time": time.time(), **record}) + "\n")


def adamw(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (norms and biases, 1-D, are not decayed)."""
    params = list({id(p): p for p in model.parameters() if p.requires_grad}.values())
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


@dataclass(frozen=True)
class Every:
    """Run ``action`` every ``minutes`` of wall-clock time while training (and not at the end)."""

    minutes: float
    action: Callable[[], None]


def train_loop(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict,
    *,
    budget: Budget,
    schedule: LRSchedule,
    step_loss: Callable[[int], tuple[torch.Tensor, int]],
    grad_clip: float = 1.0,
    every: Sequence[Every] = (),
    on_step: Callable[[float, float], None] | None = None,
    desc: str = "train",
) -> None:
    """Optimizer steps until ``budget`` is spent; ``state`` (step, tokens, elapsed_s) is updated in place.

    ``step_loss(step)`` returns the loss of one batch and how many positions it trained; the
    loop sets the LR from the budget's progress, steps the optimizer (gradients clipped to
    ``grad_clip``) and calls ``on_step(loss, lr)``. ``state`` may come from a checkpoint:
    elapsed time and tokens carry on where it stopped.
    """
    started, base_elapsed = time.time(), state["elapsed_s"]
    last_run = [time.time() for _ in every]
    bar = tqdm(total=1000, desc=f"{desc} (per-mille of budget)", file=sys.stderr, mininterval=30)
    while True:
        state["elapsed_s"] = base_elapsed + time.time() - started
        progress = budget.progress(state["tokens"], state["elapsed_s"])
        bar.update(int(progress * 1000) - bar.n)
        if progress >= 1.0:
            break
        # 1. the LR from the budget's progress
        lr = schedule.lr(state["tokens"], progress)
        set_lr(optimizer, lr)
        # 2. one optimizer step on the batch of this step
        loss, positions = step_loss(state["step"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        state["step"] += 1
        state["tokens"] += positions
        if on_step is not None:
            on_step(loss.item(), lr)
        # 3. logs, readouts and checkpoints on their wall-clock intervals
        for i, job in enumerate(every):
            if time.time() - last_run[i] >= 60 * job.minutes:
                job.action()
                last_run[i] = time.time()
    bar.close()
