"""Offline evaluation of a draft/target pair, before (and without) the serving stack.

Figures, all on data no training or tuning step saw except the validation loss:

- validation and held-out loss of both models (nats/token);
- on held-out windows: KL(p||q), alpha = E[sum_x min(p, q)] and greedy agreement;
- simulated greedy speculative decoding at ``k`` drafts per round on the held-out prompts: the
  target's greedy continuation is the committed text; each round the draft proposes k tokens
  greedily from the committed prefix, the longest prefix equal to the target's tokens is
  accepted and the target adds one token (a correction, or the bonus token when all k match).
  The mean acceptance length tau counts that extra token (tau is in [1, k + 1]), as vLLM and
  EAGLE report it; the acceptance rate is accepted / drafted.

Run: ``edgespec evaluate --target DIR --draft DIR --data-dir runs/demo/data``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from edgespec.cloud.training.alignment import alpha, cross_entropy, greedy_agreement, kl_divergence
from edgespec.cloud.training.continuation import continue_prompts
from edgespec.cloud.training.distill import check_pair
from edgespec.cloud.training.data import TokenStream
from edgespec.cloud.training.loop import configure_threads
from edgespec.cloud.training.simulate_acceptance import Acceptance, simulate_greedy
from edgespec.edge.lookup import LookupConfig
from edgespec.edge.tokenizer import load_tokenizer


@dataclass(frozen=True)
class EvalConfig:
    target: Path
    draft: Path
    data_dir: Path  # holds validation.bin and heldout.bin (edgespec train-demo's data stage)
    prompts: Path  # JSONL with a "prompt" field
    max_prompts: int = 64
    k: int = 4
    new_tokens: int = 128
    windows: int = 48
    window_len: int = 512
    threads: int = 1
    target_as_shipped: bool = True  # round the target's weights to fp16 first, as models/demo ships it

    def __post_init__(self) -> None:
        for name in ("target", "draft", "data_dir", "prompts"):
            object.__setattr__(self, name, Path(getattr(self, name)))
            if not getattr(self, name).exists():
                raise ValueError(f"{name}: {getattr(self, name)} does not exist")
        for name in ("max_prompts", "k", "new_tokens", "windows", "window_len", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class EvalResult:
    target_val_loss: float
    draft_val_loss: float
    target_heldout_loss: float
    draft_heldout_loss: float
    heldout_kl: float
    heldout_alpha: float
    heldout_greedy_agreement: float
    generated_alpha: float  # on the target's greedy continuations of the held-out prompts
    generated_greedy_agreement: float
    k: int
    tau: float
    acceptance_rate: float
    per_position_acceptance: list[float]
    rounds: int
    prompts: int
    tau_with_lookup: float | None = None  # the same rounds drafted with context lookup, as the device does
    acceptance_rate_with_lookup: float | None = None

    def summary(self) -> str:
        return (f"loss val target {self.target_val_loss:.4f} draft {self.draft_val_loss:.4f}; held-out target "
                f"{self.target_heldout_loss:.4f} draft {self.draft_heldout_loss:.4f}; held-out KL {self.heldout_kl:.4f} "
                f"alpha {self.heldout_alpha:.4f} greedy {self.heldout_greedy_agreement:.4f}; on target-greedy text alpha "
                f"{self.generated_alpha:.4f} greedy {self.generated_greedy_agreement:.4f}; k={self.k} tau {self.tau:.3f} "
                f"acceptance {self.acceptance_rate:.3f} per position {[round(x, 3) for x in self.per_position_acceptance]} "
                f"({self.rounds} rounds, {self.prompts} prompts); with context lookup tau {self.tau_with_lookup:.3f}")


@torch.no_grad()
def _logits(model, windows: torch.Tensor, batch: int = 4) -> torch.Tensor:
    return torch.cat([model(input_ids=windows[i : i + batch, :-1]).logits.float() for i in range(0, windows.size(0), batch)])


def _load(path: Path):
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def evaluate_pair(config: EvalConfig) -> EvalResult:
    configure_threads(config.threads)
    hf_logging.disable_progress_bar()
    check_pair(config.target, config.draft)
    target, draft = _load(config.target), _load(config.draft)
    if config.target_as_shipped:
        target = target.half().float()
    tokenizer = load_tokenizer(config.target)

    losses = {}
    for split in ("validation", "heldout"):
        windows = TokenStream.from_bin(config.data_dir / f"{split}.bin").fixed_windows(config.windows, config.window_len + 1)
        p, q = _logits(target, windows), _logits(draft, windows)
        losses[split] = (cross_entropy(p, windows[:, 1:]).item(), cross_entropy(q, windows[:, 1:]).item())
        if split == "heldout":
            held = (kl_divergence(p, q).item(), alpha(p, q).item(), greedy_agreement(p, q).item())
        del p, q

    rows = [json.loads(line) for line in config.prompts.read_text().splitlines() if line.strip()][: config.max_prompts]
    stats, looked_up = Acceptance(config.k), Acceptance(config.k)
    gen_alpha, gen_agree = [], []
    for row in tqdm(rows, desc="simulate greedy speculation", unit="prompt", file=sys.stderr, mininterval=10):
        prompt = torch.tensor(tokenizer.encode(row["prompt"]).ids)
        ids, p_logits = continue_prompts(target, prompt[None], config.new_tokens)
        with torch.no_grad():
            q_logits = draft(input_ids=ids[:, :-1]).logits.float()
        start = prompt.numel() - 1  # positions predicting generated tokens
        gen_alpha.append(alpha(p_logits[:, start:], q_logits[:, start:]).item())
        gen_agree.append(greedy_agreement(p_logits[:, start:], q_logits[:, start:]).item())
        simulate_greedy(draft, prompt, ids[0, prompt.numel() :], config.k, stats)
        simulate_greedy(draft, prompt, ids[0, prompt.numel() :], config.k, looked_up, LookupConfig())

    return EvalResult(
        target_val_loss=losses["validation"][0], draft_val_loss=losses["validation"][1],
        target_heldout_loss=losses["heldout"][0], draft_heldout_loss=losses["heldout"][1],
        heldout_kl=held[0], heldout_alpha=held[1], heldout_greedy_agreement=held[2],
        generated_alpha=sum(gen_alpha) / len(gen_alpha), generated_greedy_agreement=sum(gen_agree) / len(gen_agree),
        k=config.k, tau=stats.tau, acceptance_rate=stats.acceptance_rate,
        per_position_acceptance=stats.per_position, rounds=stats.rounds, prompts=len(rows),
        tau_with_lookup=looked_up.tau, acceptance_rate_with_lookup=looked_up.acceptance_rate,
    )
