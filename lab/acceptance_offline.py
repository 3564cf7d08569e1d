"""Offline acceptance of draft-side choices in sampling modes (how the sampling defaults were chosen).

For each temperature T: the target samples a continuation of each prompt; at every generated
position the per-position acceptance E[sum min(p, q)] is computed for q = the draft model's
distribution at draft temperature r*T (for each ratio r), and for q mixed with a context
lookup's point mass at weight w. With --coupled, also the acceptance of coupled mode for the
same q: P(argmax q/E == argmax p/E) with one Exp(1) per token, computed exactly
(``coupled_agreement``). Prints one JSON line per T and writes them all to --out.

    .venv/bin/python lab/acceptance_offline.py --models models/demo --prompts prompts/heldout.jsonl \\
        --ratios 0.8,0.9,1.0,1.1,1.25,1.5 --weights 1.0,0.9 --out runs/sampling/offline.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from edgespec.cloud.bench.harness import load_prompts
from edgespec.cloud.serving.accept import target_probs
from edgespec.edge.draft import DraftModel
from edgespec.edge.lookup import LookupConfig, lookup_next
from edgespec.edge.params import SamplingParams
from edgespec.edge.sampling import probs_from_logits, truncate_top_n


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def coupled_agreement(p: np.ndarray, q: np.ndarray) -> float:
    """P(argmax_v q_v / E_v == argmax_v p_v / E_v), E iid Exp(1): the draft's acceptance at one
    position in coupled mode. Both pick v iff E_w > E_v max(p_w / p_v, q_w / q_v) for every w;
    integrating over E_v gives P(both pick v) = p_v q_v / sum_w max(p_w q_v, q_w p_v)."""
    support = np.flatnonzero((q > 0) & (p > 0))  # only these can be picked by both
    if support.size == 0:
        return 0.0
    pv, qv = p[support][:, None], q[support][:, None]  # [S, 1]
    denominator = np.maximum(p[None, :] * qv, q[None, :] * pv).sum(axis=1)  # [S], over every w
    return float((p[support] * q[support] / denominator).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=Path("models/demo"), help="folder with target/ and draft/")
    parser.add_argument("--prompts", type=Path, default=Path("prompts/heldout.jsonl"))
    parser.add_argument("--prompt-limit", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--temperatures", type=floats, default=[0.3, 0.6, 0.8, 1.0, 1.2])
    parser.add_argument("--ratios", type=floats, default=[0.8, 0.9, 1.0, 1.1, 1.25, 1.5], help="draft T / target T")
    parser.add_argument("--weights", type=floats, default=[1.0, 0.9], help="lookup_weight values")
    parser.add_argument("--top-n", type=int, default=64)
    parser.add_argument("--coupled", action="store_true", help="also coupled mode's acceptance for the same q")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    torch.set_num_threads(1)
    target = AutoModelForCausalLM.from_pretrained(args.models / "target", dtype=torch.float32).eval()
    draft = DraftModel(args.models / "draft")
    prompts = load_prompts(args.prompts, args.prompt_limit)
    lookup = LookupConfig()
    torch.manual_seed(0)
    results = {}
    for temperature in args.temperatures:
        acceptance: dict[str, list[float]] = {}
        for prompt in prompts:
            ids = draft.tokenizer.encode(prompt).ids[-300:]
            with torch.no_grad():
                out = target.generate(torch.tensor([ids]), max_new_tokens=args.max_new_tokens, do_sample=True,
                                      temperature=temperature, top_k=0, pad_token_id=0)
                sequence = out[0].tolist()
                p_all = target_probs(target(torch.tensor([sequence])).logits[0], SamplingParams(temperature=temperature))
            p_all = p_all.double().numpy()
            draft_logits = draft.logits_for_context(sequence)
            for pos in range(len(ids) - 1, len(sequence) - 1):
                p = p_all[pos]
                found = lookup_next(sequence[: pos + 1], lookup)
                for ratio in args.ratios:
                    dist = truncate_top_n(probs_from_logits(draft_logits[pos], SamplingParams(temperature=max(1e-3, temperature * ratio))), args.top_n)
                    q = np.zeros_like(p)
                    q[dist.token_ids] = dist.probs
                    model = float(np.minimum(p, q).sum())
                    acceptance.setdefault(f"model r={ratio}", []).append(model)
                    if args.coupled:
                        acceptance.setdefault(f"coupled model r={ratio}", []).append(coupled_agreement(p, q))
                    for weight in args.weights:
                        if found is None:
                            mixed = model
                        else:
                            qm = (1 - weight) * q
                            qm[found] += weight
                            mixed = float(np.minimum(p, qm).sum())
                        acceptance.setdefault(f"lookup w={weight} r={ratio}", []).append(mixed)
                        if args.coupled:
                            coupled = coupled_agreement(p, q) if found is None else coupled_agreement(p, qm)
                            acceptance.setdefault(f"coupled lookup w={weight} r={ratio}", []).append(coupled)
                acceptance.setdefault("lookup hit", []).append(float(found is not None))
        results[temperature] = {name: float(np.mean(values)) for name, values in acceptance.items()}
        print(f"T={temperature}", json.dumps(results[temperature]), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
