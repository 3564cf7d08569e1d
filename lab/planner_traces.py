"""The planner replayed on real texts: where the draft of a real pair is right, token by token,
on held-out prompts, and k=auto against cloud-only and always speculating over those texts in
the scripted world of ``edgespec.cloud.simulate.planner`` (no wall clock, no link noise: the same
traces give the same figures, so a change to the planner is judged on the texts the benchmark
runs without its 0.05-0.1x of run-to-run noise).

    .venv/bin/python lab/planner_traces.py [--models models/demo] [--prompts prompts/heldout.jsonl]
        [--prompt-limit 40] [--max-new-tokens 128] [--orders 4] [--draft-ms 0.3] [--link wifi,5g] [-v]

Recording (once per pair, prompts and budget; cached under ``runs/planner_traces/``): the
target's greedy continuation of each prompt (transformers ``generate``, as the verifier's output
is), then the ONNX draft with context lookup (the shadow's own ``observe``) run over it: a hit
wherever its next-token guess is the target's token. Greedy speculation accepts a block's drafts
up to the first miss, so the hits decide every round it would run.

Replay: per link, one device (a planner kept across requests) runs the texts in turn, each
``--orders`` rotations of them (a text's forecast leans on the texts before it); cloud-only and
always speculating (adaptive k, one block in flight) are priced on the same requests. The
world's costs are the demo pair's on 2 CPU cores (``lab/planner_grid.py``), whatever pair
recorded the hits; ``--draft-ms`` sets the draft's per token (the shadow's cost: at 0.3 ms,
3.5% of the stream, it rests while the draft is unpromising; at 0.2, as the demo draft measures
in the benchmark, it never does). Per link:
k=auto over the faster path (the issue's goal: >= 0.95), over cloud-only, always speculating
over cloud-only, "per text": each text on its own faster path over cloud-only (what a planner
that knew each text before its first token would reach: no switch, no learning), and k=auto's
switches; ``-v`` adds each text's figures. Before them, the draft's hit rate by position in the
reply (``by_position``): where in a text its first rounds are measured.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from planner_grid import LINKS, WORLD  # this script's folder: the demo pair's links and costs

from edgespec.cloud.simulate.planner import Sim, World, always_speculating_ms, cloud_only_ms, rtt_phases

ROOT = Path(__file__).resolve().parents[1]


def record(models: Path, prompts_file: Path, limit: int, max_new_tokens: int) -> list[list[bool]]:
    """Per prompt, whether the draft (with context lookup) guesses each of the target's greedy
    tokens; cached by the models' and prompts' contents."""
    key = hashlib.sha256()
    for path in sorted((models / "target").glob("*")) + sorted((models / "draft").glob("*")) + [prompts_file]:
        if path.is_file():
            key.update(f"{path.name}/{path.stat().st_size}".encode() + path.read_bytes()[:1 << 20])
    key.update(f"{limit}/{max_new_tokens}".encode())
    cache = ROOT / "runs" / "planner_traces" / f"{key.hexdigest()[:16]}.json"
    if cache.exists():
        return json.loads(cache.read_text())["hits"]

    import torch
    from transformers import AutoModelForCausalLM

    from edgespec.cloud.bench.harness import load_prompts
    from edgespec.edge.draft import DraftModel
    from edgespec.edge.eos import chat_template_of
    from edgespec.edge.lookup import LookupConfig

    torch.set_num_threads(1)
    target = AutoModelForCausalLM.from_pretrained(models / "target", dtype=torch.float32).eval()
    target.generation_config.max_length = None  # (max_new_tokens decides)
    draft = DraftModel(models / "draft")
    hits = []
    for i, prompt in enumerate(load_prompts(prompts_file, limit, chat_template=chat_template_of(models / "draft"))):
        ids = draft.tokenizer.encode(prompt).ids
        with torch.no_grad():
            out = target.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                                  pad_token_id=draft.eos_token_ids[0] if draft.eos_token_ids else 0)
        generated = out[0].tolist()[len(ids):]
        draft.reset(ids)
        guesses = draft.observe(generated, LookupConfig())
        hits.append([guess == token for guess, token in zip(guesses, generated)])
        print(f"  recorded text {i + 1}: {sum(hits[-1])}/{len(hits[-1])} tokens guessed", file=sys.stderr, flush=True)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"models": str(models), "prompts": str(prompts_file), "hits": hits}))
    return hits


def replay(hits: list[list[bool]], rtt: float, orders: int, verbose: bool = False,
           draft_ms: float = WORLD["draft_ms"]) -> tuple[float, float, float, float, int]:
    """ms of k=auto, cloud-only, always speculating and each text's faster path (the best any
    choice made at a text's first token can do) over every rotation, and k=auto's switches.
    A request's budget is its text's length (a reply that ended before ``--max-new-tokens``)."""
    n = len(hits)
    auto = cloud = spec = best = 0.0
    switches = 0
    for order in range(orders):
        texts = [hits[(order * max(n // orders, 1) + i) % n] for i in range(n)]
        flat = [hit for text in texts for hit in text]
        world = World(rtt_ms=rtt_phases((0, rtt)), hits=lambda p, flat=flat: flat[p] if p < len(flat) else False,
                      **(WORLD | {"draft_ms": draft_ms}))
        sim, start = Sim(world), 0
        for i, text in enumerate(texts):
            run = sim.generate(len(text))
            c, s = cloud_only_ms(world, len(text), start), always_speculating_ms(world, len(text), start)
            auto, cloud, spec, best, start = auto + run.ms, cloud + c, spec + s, best + min(c, s), start + len(text)
            switches += len(run.switches) - 1
            if verbose:
                log = "; ".join(f"@{sw.at_token} {sw.to_path[:5]}" for sw in run.switches)
                print(f"    order {order} text {i}: hits {sum(text):3d}/{len(text)}  auto {run.ms / len(text):5.2f}  cloud "
                      f"{c / len(text):5.2f}  spec {s / len(text):5.2f}  {log}")
    return auto, cloud, spec, best, switches


def by_position(hits: list[list[bool]], edges: tuple[int, ...] | None = None) -> list[tuple[int, int, float]]:
    """The share of tokens the draft guesses, per span of positions in the reply (pooled over the
    texts that reach each span): a reply's first tokens are the draft's hardest (the demo pair:
    0.68 over tokens 0-7, 0.97 over 64-127), so a text's first rounds understate its rest.
    ``edges``: the spans' bounds; by default 0, 8, then doubling past the longest reply."""
    if edges is None:
        edges = (0, 8)
        while edges[-1] < max(map(len, hits), default=0):
            edges += (2 * edges[-1],)
    spans = []
    for lo, hi in zip(edges, edges[1:]):
        cells = [hit for text in hits for hit in text[lo:hi]]
        if cells:
            spans.append((lo, hi, sum(cells) / len(cells)))
    return spans


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=ROOT / "models" / "demo", help="folder with target/ and draft/")
    parser.add_argument("--prompts", type=Path, default=ROOT / "prompts" / "heldout.jsonl")
    parser.add_argument("--prompt-limit", type=int, default=40)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--orders", type=int, default=4, help="rotations of the texts each device runs")
    parser.add_argument("--link", default=",".join(LINKS), help="links, comma-separated: " + ", ".join(LINKS))
    parser.add_argument("--draft-ms", type=float, default=WORLD["draft_ms"],
                        help="the draft's time per token on the device (the shadow's cost: under 3%% of the stream, it never rests)")
    parser.add_argument("-v", "--verbose", action="store_true", help="each text's figures and switches")
    args = parser.parse_args()
    hits = record(args.models, args.prompts, args.prompt_limit, args.max_new_tokens)
    print(f"{len(hits)} texts, the draft right on {sum(map(sum, hits)) / sum(map(len, hits)):.2f} of their tokens "
          f"(per text {', '.join(f'{sum(t) / len(t):.2f}' for t in hits)})")
    print("by position in the reply: " + ", ".join(f"{lo}-{hi - 1} {share:.2f}" for lo, hi, share in by_position(hits)))
    print(f"{'link':10s}{'k=auto / faster':>17s}{'/ cloud-only':>14s}{'spec / cloud':>14s}{'per text':>10s}{'switches':>10s}")
    ratios = []
    for link in args.link.split(","):
        if args.verbose:
            print(f"  {link}:")
        auto, cloud, spec, best, switches = replay(hits, LINKS[link], args.orders, args.verbose, args.draft_ms)
        ratios.append(min(cloud, spec) / auto)
        print(f"{link:10s}{ratios[-1]:17.3f}{cloud / auto:14.3f}{cloud / spec:14.3f}{cloud / best:10.3f}{switches:10d}")
    print(f"mean {sum(ratios) / len(ratios):.3f}, worst {min(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
