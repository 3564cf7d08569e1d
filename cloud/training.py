"""What every training loop here shares: a budgeted LR schedule and resumable checkpoints.

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
import time
from dataclasses import dataclass
from pathlib import Path

import torch

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
