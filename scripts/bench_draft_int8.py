"""Drafting cost of an int8 draft against its float graph, one ONNX Runtime thread each.

    .venv/bin/python scripts/bench_draft_int8.py DRAFT_DIR [--tokens 64] [--repeats 3]

DRAFT_DIR comes from ``edgespec export-draft --quantize int8 --keep-fp32`` (model.onnx is the
int8 graph, model.fp32.onnx the float one). Each arm greedy-decodes ``--tokens`` tokens one at a
time after a short prompt (the device's drafting step: one new token against a growing cache);
the arms alternate ``--repeats`` times and the median ms/token is printed, with how often the two
graphs' greedy tokens agree and the graphs' sizes.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from edgespec.cloud.training.export import FLOAT_ONNX_FILE
from edgespec.edge.graph import GraphRunner, open_session
from edgespec.edge.manifest import DraftManifest
from edgespec.edge.tokenizer import load_tokenizer

PROMPT = "def parse_args(argv=None):\n    parser = argparse.ArgumentParser("


def decode(session, manifest, prompt: list[int], tokens: int) -> tuple[float, list[int]]:
    runner = GraphRunner(session, manifest)
    logits = runner.feed(prompt)[-1]
    out, started = [], time.perf_counter()
    for _ in range(tokens):
        out.append(int(logits.argmax()))
        logits = runner.feed([out[-1]])[-1]
    return (time.perf_counter() - started) * 1e3 / tokens, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("draft", type=Path)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    manifest = DraftManifest.load(args.draft)
    prompt = load_tokenizer(args.draft).encode(PROMPT).ids
    arms = {"fp32": args.draft / FLOAT_ONNX_FILE, "int8": args.draft / manifest.onnx_file}
    sessions = {name: open_session(path, threads=1) for name, path in arms.items()}
    times: dict[str, list[float]] = {name: [] for name in arms}
    outputs = {}
    for _ in range(args.repeats):
        for name, session in sessions.items():
            ms, outputs[name] = decode(session, manifest, prompt, args.tokens)
            times[name].append(ms)
    agree = sum(a == b for a, b in zip(outputs["fp32"], outputs["int8"])) / args.tokens
    for name, path in arms.items():
        print(f"{name}: {statistics.median(times[name]):.2f} ms/token (median of {args.repeats}), "
              f"{path.stat().st_size / 2**20:.1f} MiB")
    print(f"int8 / fp32 time: {statistics.median(times['int8']) / statistics.median(times['fp32']):.2f}; "
          f"greedy tokens equal at {agree:.0%} of {args.tokens} positions (free-running, so one early difference changes the rest)")


if __name__ == "__main__":
    main()
