"""A corpus of the target's own greedy continuations, for training a draft (``generate`` stage).

Greedy verification only ever asks the draft to guess the target's greedy output, so the
best text to train a draft on is that output. Generating it is the expensive part (one
target forward per token, batched), so it is done once, in resumable chunks, and reused by
every epoch of distillation: ``out_dir/chunk-00000.npy`` ... each ``[batch, prompt_len +
new_tokens]`` uint16, the first ``prompt_len`` ids a window of the training text (the
prompt), the rest the target's greedy continuation. ``meta.json`` records the settings; a
resumed run refuses different ones.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from edgespec.cloud.training.continuation import continue_prompts
from edgespec.cloud.training.data import TokenStream
from edgespec.cloud.training.loop import configure_threads

META = "meta.json"


@dataclass(frozen=True)
class TargetTextConfig:
    target: Path
    data: Path  # a .bin token file (uint16 ids) to cut prompts from
    out_dir: Path
    sequences: int = 8192  # upper bound; ``minutes`` may end the run first
    minutes: float = 0.0  # wall-clock budget (0: none)
    prompt_len: int = 128
    new_tokens: int = 192
    batch: int = 48
    seed: int = 0
    threads: int = 1

    def __post_init__(self) -> None:
        for name in ("target", "data", "out_dir"):
            object.__setattr__(self, name, Path(getattr(self, name)))
        for name in ("sequences", "prompt_len", "new_tokens", "batch", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.minutes < 0:
            raise ValueError(f"minutes must be >= 0, got {self.minutes}")
        if not (self.target / "config.json").is_file():
            raise ValueError(f"target: {self.target} is not a Hugging Face model directory (no config.json)")

    def settings(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k in ("prompt_len", "new_tokens", "batch", "seed")} | {"target": str(self.target)}


def chunks(out_dir: Path) -> list[Path]:
    return sorted(Path(out_dir).glob("chunk-*.npy"))


def load_target_text(out_dir: Path) -> tuple[np.ndarray, int]:
    """All generated sequences [n, prompt_len + new_tokens] and the prompt length."""
    meta = json.loads((Path(out_dir) / META).read_text())
    found = chunks(out_dir)
    if not found:
        raise ValueError(f"{out_dir} holds no generated chunks: run the generate stage first")
    return np.concatenate([np.load(p) for p in found]), int(meta["prompt_len"])


def generate_target_text(config: TargetTextConfig, progress=print) -> int:
    """Generates chunks until ``sequences`` or ``minutes`` is reached; returns the sequences on disk."""
    configure_threads(config.threads)
    hf_logging.disable_progress_bar()
    out = config.out_dir
    out.mkdir(parents=True, exist_ok=True)
    meta_path = out / META
    if meta_path.is_file():
        old = json.loads(meta_path.read_text())
        if {k: old.get(k) for k in config.settings()} != config.settings():
            raise ValueError(f"{out} was generated with {old}, not {config.settings()}: choose another directory")
    meta_path.write_text(json.dumps(config.settings(), indent=1) + "\n")
    model = AutoModelForCausalLM.from_pretrained(str(config.target), dtype=torch.float32).eval()
    stream = TokenStream.from_bin(config.data)
    done = len(chunks(out)) * config.batch
    first, started = done, time.time()
    while done < config.sequences and not (config.minutes and time.time() - started > 60 * config.minutes):
        index = done // config.batch
        gen = torch.Generator().manual_seed(config.seed * 1_000_003 + index)
        prompts = stream.random_windows(config.batch, config.prompt_len, gen)
        ids, _ = continue_prompts(model, prompts, config.new_tokens, keep_logits=False)
        tmp = out / f"chunk-{index:05d}.tmp.npy"
        np.save(tmp, ids.numpy().astype(np.uint16))
        tmp.rename(out / f"chunk-{index:05d}.npy")
        done += config.batch
        elapsed = time.time() - started
        progress(f"generate: {done:,} sequences ({done * config.new_tokens:,} target tokens), "
                 f"{elapsed / 60:.1f} min, {(done - first) * config.new_tokens / max(elapsed, 1e-9):.0f} tok/s")
    return done
