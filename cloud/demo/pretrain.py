"""Next-token pretraining of a demo model on a flat token file, under a budget, resumably.

Used for both the target and the draft. Layout of ``out_dir``::

    checkpoint/    latest resumable state (HF dir + optimizer.pt + trainer_state.json)
    final/         the trained model with its tokenizer, written when the budget is spent
    train.log      one line per log interval / evaluation
    metrics.jsonl  the same figures as JSON

Batches are drawn from a generator seeded by (seed, step), so a resumed run sees exactly the
batches an uninterrupted one would have.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM
from transformers.utils import logging as hf_logging

from edgespec.cloud.demo.models import ModelShape, grow, param_count
from edgespec.cloud.training.data import TokenStream
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


@dataclass(frozen=True)
class PretrainConfig:
    data_dir: Path
    out_dir: Path
    shape: ModelShape
    budget: Budget
    seq_len: int = 512
    batch_size: int = 4
    schedule: LRSchedule = field(default_factory=lambda: LRSchedule(peak=2e-3, warmup_tokens=400_000))
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    checkpoint_minutes: float = 10.0
    log_minutes: float = 2.0
    eval_windows: int = 48
    seed: int = 0
    threads: int = 1
    init: Path | None = None  # start from this model (grown to ``shape``, see models.grow) instead of random weights

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        object.__setattr__(self, "out_dir", Path(self.out_dir))
        if self.init is not None:
            object.__setattr__(self, "init", Path(self.init))
            if not (self.init / "config.json").is_file():
                raise ValueError(f"init: {self.init} is not a Hugging Face model directory (no config.json)")
        for name in ("seq_len", "batch_size", "eval_windows", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.seq_len > self.shape.max_positions:
            raise ValueError(f"seq_len ({self.seq_len}) exceeds shape.max_positions ({self.shape.max_positions})")
        for name in ("checkpoint_minutes", "log_minutes", "grad_clip"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")


def lm_loss(model, windows: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (nats) over [batch, length] windows."""
    logits = model(input_ids=windows[:, :-1]).logits
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), windows[:, 1:].reshape(-1))


@torch.no_grad()
def evaluate_loss(model, windows: torch.Tensor, batch_size: int = 4) -> float:
    was_training = model.training
    model.eval()
    total = 0.0
    for i in range(0, windows.size(0), batch_size):
        chunk = windows[i : i + batch_size]
        total += lm_loss(model, chunk).item() * chunk.size(0)
    model.train(was_training)
    return total / windows.size(0)


def _load_or_init(config: PretrainConfig, vocab_size: int, log: RunLog):
    ckpt = config.out_dir / "checkpoint"
    if checkpoint_exists(ckpt):
        model = LlamaForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32)
        optimizer = adamw(model, config.schedule.peak, config.weight_decay)
        state = load_trainer_state(ckpt, optimizer)
        log(f"resumed from {ckpt}: step {state['step']}, {state['tokens']:,} tokens, {state['elapsed_s'] / 60:.1f} min")
        return model, optimizer, state
    torch.manual_seed(config.seed)
    if config.init is not None:
        start = LlamaForCausalLM.from_pretrained(str(config.init), dtype=torch.float32)
        model = grow(start, config.shape)
        log(f"initialised from {config.init} ({start.config.num_hidden_layers} layer(s), grown to {config.shape.layers})")
    else:
        model = LlamaForCausalLM(config.shape.llama_config(vocab_size))
    return model, adamw(model, config.schedule.peak, config.weight_decay), {"step": 0, "tokens": 0, "elapsed_s": 0.0, "evals": []}


def pretrain(config: PretrainConfig) -> dict:
    """Trains until the budget is spent (resuming any checkpoint); returns the final trainer state."""
    configure_threads(config.threads)
    hf_logging.disable_progress_bar()
    config.out_dir.mkdir(parents=True, exist_ok=True)
    log = RunLog(config.out_dir, "train.log", "metrics.jsonl")
    tokenizer_dir = config.data_dir / "tokenizer"
    train = TokenStream.from_bin(config.data_dir / "train.bin")
    val_windows = TokenStream.from_bin(config.data_dir / "validation.bin").fixed_windows(config.eval_windows, config.seq_len + 1)
    vocab_size = int(json.loads((config.data_dir / "manifest.json").read_text())["vocab_size"])

    model, optimizer, state = _load_or_init(config, vocab_size, log)
    final = config.out_dir / "final"
    if config.budget.progress(state["tokens"], state["elapsed_s"]) >= 1.0 and checkpoint_exists(final):
        log(f"budget already spent ({state['tokens']:,} tokens); {final} is up to date")
        return state
    log(f"config {json.dumps(asdict(config), default=str)}")
    log(f"model {config.shape} params {param_count(model):,}; train tokens {len(train):,}")
    model.train()

    def checkpoint() -> None:
        if not state["evals"] or state["evals"][-1]["step"] != state["step"]:
            val = evaluate_loss(model, val_windows)
            state["evals"].append({"step": state["step"], "tokens": state["tokens"], "val_loss": val})
            log(f"eval step {state['step']} tokens {state['tokens']:,} val_loss {val:.4f}",
                kind="eval", step=state["step"], tokens=state["tokens"], val_loss=val, elapsed_s=state["elapsed_s"])
        save_checkpoint(config.out_dir / "checkpoint", model, optimizer, state, tokenizer_dir)

    losses: list[float] = []
    last_log = [time.time()]

    def step_loss(step: int) -> tuple[torch.Tensor, int]:
        gen = torch.Generator().manual_seed(config.seed * 1_000_003 + step)  # batches from (seed, step)
        return lm_loss(model, train.random_windows(config.batch_size, config.seq_len + 1, gen)), config.batch_size * config.seq_len

    def log_losses() -> None:
        now, lr = time.time(), optimizer.param_groups[0]["lr"]
        mean = sum(losses) / max(len(losses), 1)
        rate = config.batch_size * config.seq_len * len(losses) / (now - last_log[0])
        progress = config.budget.progress(state["tokens"], state["elapsed_s"])
        log(f"step {state['step']} tokens {state['tokens']:,} train_loss {mean:.4f} lr {lr:.2e} "
            f"{rate:.0f} tok/s progress {progress:.3f}",
            kind="train", step=state["step"], tokens=state["tokens"], train_loss=mean, lr=lr, tok_s=rate,
            elapsed_s=state["elapsed_s"])
        losses.clear()
        last_log[0] = now

    train_loop(
        model, optimizer, state, budget=config.budget, schedule=config.schedule, step_loss=step_loss,
        grad_clip=config.grad_clip, every=[Every(config.log_minutes, log_losses), Every(config.checkpoint_minutes, checkpoint)],
        on_step=lambda loss, lr: losses.append(loss), desc="pretrain",
    )
    checkpoint()
    save_checkpoint(final, model, None, state, tokenizer_dir)
    log(f"done: {state['tokens']:,} tokens in {state['elapsed_s'] / 60:.1f} min -> {final}")
    return state
