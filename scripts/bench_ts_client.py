"""ms/token of the TypeScript client (Node) against the Python SDK: the demo pair, one local Serve
on loopback, the same held-out prompts, greedy, one draft thread on each side.

    .venv/bin/python scripts/bench_ts_client.py [--prompts prompts/heldout.jsonl] [--count 8]
        [--max-new-tokens 64] [--k auto] [--rounds 2] [--address HOST:PORT] [--ws ws://HOST:PORT]

Each client runs the prompts in turn (Python, Node, Node, Python, ... ABBA over ``--rounds``
pairs), after one warm-up request; the figure is total wall time over total generated tokens per
client, and their ratio. With ``--ws`` the Node client also runs over the WebSocket route. The
greedy outputs must agree token for token (exit 1 otherwise). Without ``--address`` it starts
Serve itself (hold /tmp/edgespec-ray.lock beside other Ray users).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "clients" / "typescript"
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
DEMO_TARGET, DEMO_DRAFT = ROOT / "models" / "demo" / "target", ROOT / "models" / "demo" / "draft"


def prompt_lines(path: Path, count: int, draft_dir: Path) -> list[dict]:
    from edgespec.edge.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(draft_dir)
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()][:count]
    return [{"id": row.get("id", str(i)), "prompt_ids": tokenizer.encode(row["prompt"]).ids} for i, row in enumerate(rows)]


def run_python(address: str, draft_dir: Path, prompts: list[dict], max_new_tokens: int, k) -> list[dict]:
    from edgespec.edge.client import EdgeClient

    out = []
    with EdgeClient(address, draft_dir, draft_threads=1) as client:
        client.generate(prompts[0]["prompt_ids"], max_new_tokens=max_new_tokens, k=k, stop_token_ids=())  # warm-up
        for row in prompts:
            started = time.perf_counter()
            result = client.generate(row["prompt_ids"], max_new_tokens=max_new_tokens, k=k, stop_token_ids=())
            out.append({"id": row["id"], "token_ids": result.token_ids, "wall_s": time.perf_counter() - started,
                        "generated": len(result.token_ids)})
    return out


def run_node(address: str, draft_dir: Path, prompts: list[dict], max_new_tokens: int, k, timeout_s: float = 900) -> list[dict]:
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.write("".join(json.dumps(row) + "\n" for row in prompts))
    try:
        done = subprocess.run(
            ["npx", "tsx", "bench/generate.ts", "--address", address, "--draft", str(draft_dir), "--prompts", f.name,
             "--max-new-tokens", str(max_new_tokens), "--k", str(k), "--warmup", "1"],
            cwd=PACKAGE, capture_output=True, text=True, timeout=timeout_s)
    finally:
        os.unlink(f.name)
    if done.returncode != 0:
        raise RuntimeError(f"the Node client failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def start_serve(target: Path) -> tuple[str, int]:
    from edgespec.cloud.serving.app import init_ray, serve_verifier
    from edgespec.cloud.serving.config import DeploymentOptions, VerifierConfig
    from edgespec.cloud.serving.haproxy_owner import free_port

    init_ray(num_cpus=2)
    port, http_port = free_port(), free_port()
    config = VerifierConfig(model=str(target), device="cpu", torch_threads=1)
    address = serve_verifier(config, DeploymentOptions(num_cpus=1), grpc_port=port, http_port=http_port, timeout_s=300)
    return address, http_port


def ms_per_token(runs: list[list[dict]]) -> float:
    rows = [row for run in runs for row in run]
    return 1000 * sum(r["wall_s"] for r in rows) / max(1, sum(r["generated"] for r in rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--prompts", type=Path, default=ROOT / "prompts" / "heldout.jsonl")
    parser.add_argument("--count", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--k", default="auto")
    parser.add_argument("--rounds", type=int, default=2, help="ABBA pairs of (Python, Node) runs")
    parser.add_argument("--target", type=Path, default=DEMO_TARGET)
    parser.add_argument("--draft", type=Path, default=DEMO_DRAFT)
    parser.add_argument("--address", help="a running verifier (else Serve is started here)")
    parser.add_argument("--ws", help="also the Node client over this WebSocket URL (ws://HOST:HTTP_PORT); "
                        "where Serve is started here, its own HTTP port unless --no-ws")
    parser.add_argument("--no-ws", action="store_true", help="gRPC only")
    args = parser.parse_args(argv)
    k = args.k if args.k == "auto" else int(args.k)
    prompts = prompt_lines(args.prompts, args.count, args.draft)
    started_here = args.address is None
    address, ws = args.address, args.ws
    if started_here:
        address, http_port = start_serve(args.target)
        ws = ws or (None if args.no_ws else f"ws://127.0.0.1:{http_port}")
    try:
        python_runs, node_runs, ws_runs = [], [], []
        for pair in range(args.rounds):
            order = ("python", "node") if pair % 2 == 0 else ("node", "python")
            for who in order:
                if who == "python":
                    python_runs.append(run_python(address, args.draft, prompts, args.max_new_tokens, k))
                else:
                    node_runs.append(run_node(address, args.draft, prompts, args.max_new_tokens, k))
            if ws:
                ws_runs.append(run_node(ws, args.draft, prompts, args.max_new_tokens, k))
    finally:
        if started_here:
            from edgespec.cloud.serving.app import stop_serving

            stop_serving()
    py, node = ms_per_token(python_runs), ms_per_token(node_runs)
    print(f"{len(prompts)} prompts x {args.rounds * 2} runs, {args.max_new_tokens} new tokens, k={args.k}, greedy")
    print(f"Python SDK       {py:7.2f} ms/token")
    print(f"Node, gRPC       {node:7.2f} ms/token   ({node / py:.2f}x the Python SDK)")
    if ws_runs:
        print(f"Node, WebSocket  {ms_per_token(ws_runs):7.2f} ms/token   ({ms_per_token(ws_runs) / py:.2f}x)")
    reference = {row["id"]: row["token_ids"] for row in python_runs[0]}
    differ = [row["id"] for run in node_runs + ws_runs for row in run if row["token_ids"] != reference[row["id"]]]
    if differ:
        print(f"greedy outputs differ from the Python SDK's on: {sorted(set(differ))}")
        return 1
    print("greedy outputs: identical to the Python SDK's on every prompt and run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
