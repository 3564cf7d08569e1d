"""``edgespec bench ingress``: Ray Serve's gRPC ingresses side by side on one replica.

For each ingress (``edgespec.cloud.serving.ingress``: haproxy, proxy, direct) a fresh Ray
instance is started in a child process (the flags are read when Ray is imported, so one
process cannot hold two ingresses), and it measures, in this order:

1. per-round latency of one raw gRPC session sending k-token drafts back to back (greedy,
   random drafts: this times the server path, not acceptance); the round's *overhead* is its
   send -> verdict time minus the forward + accept time the replica reports in the verdict;
2. verify throughput at N concurrent raw sessions (verified tokens/s and batch sizes);
3. end to end with the real client and ONNX draft: speculative vs cloud-only ms/token on the
   prompts, arms alternating prompt by prompt.

The ingresses run one after another (order given by ``--ingresses``), each on the same target,
torch pinned to one thread; compare them as ratios within one run.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from edgespec.cloud.serving.ingress import INGRESSES
from edgespec.edge import loop as sdk_loop


@dataclass(frozen=True)
class IngressBenchConfig:
    target: Path
    draft: Path
    prompts: list[str]
    ingresses: tuple[str, ...] = ("haproxy", "proxy", "direct")
    k: int = 4
    rounds: int = 200
    sessions: int = 16
    max_new_tokens: int = 96
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = [name for name in self.ingresses if name not in INGRESSES]
        if unknown or not self.ingresses:
            raise ValueError(f"ingresses must be a non-empty subset of {INGRESSES}, got {self.ingresses}")
        for name in ("k", "rounds", "sessions", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.prompts:
            raise ValueError("prompts: at least one prompt is needed")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1)))]


STEADY_FROM_ROUND = 2  # a raw session's rounds from this one on are past every session's opening


async def _raw_session(address: str, fingerprint: str, vocab: int, k: int, rounds: int, seed: int, out: dict,
                       prompt_len: int = 32) -> None:
    import grpc

    from edgespec.v1 import speculative_pb2 as pb
    from edgespec.v1 import speculative_pb2_grpc as pb_grpc

    rng = random.Random(seed)
    async with grpc.aio.insecure_channel(address) as channel:
        call = pb_grpc.SpeculativeStub(channel).Session()
        prompt = [rng.randrange(vocab) for _ in range(prompt_len)]
        await call.write(pb.SessionRequest(open=pb.Open(
            prompt_ids=prompt, mode=pb.VERIFY_MODE_GREEDY, tokenizer_fingerprint=fingerprint, max_new_tokens=rounds * (k + 1),
        )))
        opened = await call.read()
        assert opened.HasField("opened"), opened
        for r in range(rounds):
            drafts = [rng.randrange(vocab) for _ in range(k)]
            started = time.perf_counter()
            await call.write(pb.SessionRequest(draft=pb.Draft(round=r, token_ids=drafts)))
            verdict = (await call.read()).verdict
            latency = (time.perf_counter() - started) * 1000
            out["latency_ms"].append(latency)
            if r >= STEADY_FROM_ROUND:
                out["steady_latency_ms"].append(latency)
            out["overhead_ms"].append(latency - verdict.verify_ms)
            out["batch"].append(verdict.batch_size)
            out["verify_ms"].append(verdict.verify_ms)
            out["verified"] += k + 1
            if verdict.finished:
                break
        await call.write(pb.SessionRequest(close=pb.Close()))
        await call.done_writing()
        await call.read()  # Closed


def raw_rounds(address: str, fingerprint: str, vocab: int, k: int, rounds: int, sessions: int, prompt_len: int = 32) -> dict:
    """N raw sessions at once, each ``rounds`` rounds of k random drafts after a random prompt of
    ``prompt_len`` tokens (a forward's cost grows with its rows' context); the figures of all of them."""
    out = {"latency_ms": [], "steady_latency_ms": [], "overhead_ms": [], "batch": [], "verify_ms": [], "verified": 0}

    async def run_all():
        await asyncio.gather(*(_raw_session(address, fingerprint, vocab, k, rounds, s, out, prompt_len) for s in range(sessions)))

    started = time.perf_counter()
    sdk_loop.run(run_all())
    wall = time.perf_counter() - started
    by_batch: dict[int, list[float]] = {}
    for batch, verify_ms in zip(out["batch"], out["verify_ms"]):
        by_batch.setdefault(batch, []).append(verify_ms)
    return {
        "sessions": sessions,
        "k": k,
        "round_ms_median": statistics.median(out["latency_ms"]),
        "round_ms_mean": statistics.fmean(out["latency_ms"]),
        # Without each session's first rounds: the sessions open together and their prefills
        # queue on the model thread, so the first sessions' first round waits for all of them.
        "round_ms_steady_mean": statistics.fmean(out["steady_latency_ms"] or out["latency_ms"]),
        "round_ms_p90": percentile(out["latency_ms"], 0.9),
        "overhead_ms_median": statistics.median(out["overhead_ms"]),
        "verify_ms_median": statistics.median(out["verify_ms"]),
        "verified_tokens_per_s": out["verified"] / wall,
        "batch_mean": statistics.mean(out["batch"]),
        "batch_max": max(out["batch"]),
        # The replica's forward + accept time by batch size: (rounds, median ms).
        "verify_ms_by_batch": {b: (len(v), statistics.median(v)) for b, v in sorted(by_batch.items())},
    }


def measure_one(config: dict) -> dict:
    """Runs in the child process: start Serve with ``config['ingress']``, measure, shut down."""
    from edgespec.cloud.bench.harness import Harness, Summary

    draft, prompts = Path(config["draft"]), config["prompts"]
    with Harness(Path(config["target"]), draft, ingress=config["ingress"], max_sessions=config["sessions"] + 8,
                 progress=lambda m: print(m, file=sys.stderr, flush=True)) as harness:
        info = harness.info
        harness.warm_up(prompts[0])
        raw_rounds(harness.server, info.tokenizer_fingerprint, info.vocab_size, config["k"], 20, 1)  # warm-up
        one = raw_rounds(harness.server, info.tokenizer_fingerprint, info.vocab_size, config["k"], config["rounds"], 1)
        many = raw_rounds(harness.server, info.tokenizer_fingerprint, info.vocab_size, config["k"],
                          max(config["rounds"] // 4, 20), config["sessions"])
        params = dict(max_new_tokens=config["max_new_tokens"], k=config["k"], stop_token_ids=(), seed=config["seed"])
        spec, cloud = harness.compare(prompts, params, config["ingress"])
        spec_s, cloud_s = Summary.of(spec), Summary.of(cloud)
    return {
        "ingress": config["ingress"],
        "one_session": one,
        "many_sessions": many,
        "speculative_ms_per_token": spec_s.ms_per_token,
        "cloud_only_ms_per_token": cloud_s.ms_per_token,
        "speedup": cloud_s.ms_per_token / spec_s.ms_per_token,
        "tau": spec_s.tau,
        "identical": sum(s.token_ids == c.token_ids for s, c in zip(spec, cloud)),
        "generations": len(spec),
    }


def run_ingress_bench(config: IngressBenchConfig, progress: Callable[[str], None] = print) -> list[dict]:
    rows = []
    for index, ingress in enumerate(config.ingresses):
        progress(f"[{index + 1}/{len(config.ingresses)}] ingress {ingress}: starting Ray and Serve in a child process")
        payload = {**asdict(config), "ingress": ingress, "target": str(config.target), "draft": str(config.draft)}
        with tempfile.TemporaryDirectory() as tmp:
            result = Path(tmp) / "row.json"
            code = ("import json, sys; from pathlib import Path; from edgespec.cloud.bench.ingress import measure_one; "
                    f"Path({str(result)!r}).write_text(json.dumps(measure_one(json.load(sys.stdin))))")
            proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(payload), capture_output=True, text=True, timeout=1800)
            if proc.returncode != 0 or not result.is_file():
                raise RuntimeError(f"the {ingress} measurement failed:\n{proc.stderr[-3000:]}")
            row = json.loads(result.read_text())
        progress(
            f"  {ingress}: round {row['one_session']['round_ms_median']:.2f} ms (overhead {row['one_session']['overhead_ms_median']:.2f} ms "
            f"beyond the {row['one_session']['verify_ms_median']:.2f} ms forward), {config.sessions} sessions "
            f"{row['many_sessions']['verified_tokens_per_s']:.0f} verified tok/s, end to end "
            f"{row['speculative_ms_per_token']:.2f} vs {row['cloud_only_ms_per_token']:.2f} ms/token ({row['speedup']:.2f}x)"
        )
        rows.append(row)
    return rows


def markdown(rows: list[dict], config: IngressBenchConfig) -> str:
    lines = [
        "# Serve gRPC ingresses side by side",
        "",
        f"Target `{config.target}`, draft `{config.draft}`, k={config.k}, loopback, 1 torch thread. Raw rounds: random "
        f"greedy drafts, 1 session x {config.rounds} rounds and {config.sessions} sessions; end to end: {len(config.prompts)} "
        f"prompts x {config.max_new_tokens} tokens, speculative and cloud-only alternating.",
        "",
        "| ingress | round ms (median / p90) | overhead beyond the forward, ms | forward ms | verified tok/s at "
        f"{config.sessions} sessions (batch mean) | speculative ms/token | cloud-only ms/token | speedup |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        one, many = row["one_session"], row["many_sessions"]
        lines.append(
            f"| {row['ingress']} | {one['round_ms_median']:.2f} / {one['round_ms_p90']:.2f} | {one['overhead_ms_median']:.2f} | "
            f"{one['verify_ms_median']:.2f} | {many['verified_tokens_per_s']:.0f} ({many['batch_mean']:.1f}) | "
            f"{row['speculative_ms_per_token']:.2f} | {row['cloud_only_ms_per_token']:.2f} | {row['speedup']:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def write_ingress_report(rows: list[dict], config: IngressBenchConfig, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items() if k != "prompts"}
    (out / "ingress.json").write_text(json.dumps({"config": settings, "rows": rows}, indent=2))
    (out / "ingress.md").write_text(markdown(rows, config))
    return [out / "ingress.json", out / "ingress.md"]
