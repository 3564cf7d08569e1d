"""``edgespec bench load`` and ``edgespec bench kill``: the verifier under many sessions, and
through the loss of a replica.

load: N concurrent raw sessions, each R rounds of k random greedy drafts (the committed output
is the target's greedy output whatever the drafts are, so every session's tokens are checked
against a reference), while a probe session measures round latency; reports p50/p90 round
latency before, during and after, the replica's RSS before, at its peak and after, and whether
every output was exact.

kill: two replicas; a device generates through the SDK (resuming on a broken stream) while the
replica holding its session is killed (SIGKILL of its process); reports the longest gap
between committed rounds (the outage), the gaps' p50/p90 before, during (2 s) and after, and
whether the output was exact.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from edgespec.cloud.bench.ingress import percentile
from edgespec.edge import loop as sdk_loop


@dataclass(frozen=True)
class LoadConfig:
    target: Path
    draft: Path
    prompts: list[str]
    sessions: int = 64
    rounds: int = 200
    k: int = 4
    distinct_prompts: int = 8  # sessions share them: equal outputs are expected
    api_key: str | None = None


def _latency(samples: list[float]) -> dict:
    return {"p50_ms": statistics.median(samples), "p90_ms": percentile(samples, 0.9), "rounds": len(samples)} if samples else {}


async def _raw_session(stub, fingerprint: str, vocab: int, prompt: list[int], k: int, rounds: int, seed: int, metadata):
    from edgespec.v1 import speculative_pb2 as pb

    rng = random.Random(seed)
    requests: asyncio.Queue = asyncio.Queue()

    async def feed():
        while (item := await requests.get()) is not None:
            yield item

    call = stub.Session(feed(), metadata=metadata)
    committed: list[int] = []
    await requests.put(pb.SessionRequest(open=pb.Open(prompt_ids=prompt, mode=pb.VERIFY_MODE_GREEDY, tokenizer_fingerprint=fingerprint,
                                                      max_new_tokens=rounds * (k + 1))))
    replies = call.__aiter__()
    assert (await replies.__anext__()).HasField("opened")
    for r in range(rounds):
        drafts = [rng.randrange(vocab) for _ in range(k)]
        await requests.put(pb.SessionRequest(draft=pb.Draft(round=r, token_ids=drafts)))
        verdict = (await replies.__anext__()).verdict
        committed += drafts[: verdict.accepted] + [verdict.next_token]
        if verdict.finished:
            break
    await requests.put(pb.SessionRequest(close=pb.Close()))
    await requests.put(None)
    async for _ in replies:
        pass
    return committed


def run_load(config: LoadConfig, progress: Callable[[str], None] = print) -> dict:
    import grpc
    import torch
    from transformers import AutoModelForCausalLM

    from edgespec.cloud.bench.harness import Harness
    from edgespec.edge.tokenizer import load_tokenizer
    from edgespec.v1 import speculative_pb2 as pb
    from edgespec.v1 import speculative_pb2_grpc as pb_grpc

    metadata = (("authorization", f"Bearer {config.api_key}"),) if config.api_key else None
    texts = config.prompts[: config.distinct_prompts]
    tokenizer = load_tokenizer(config.target)
    prompts = [tokenizer.encode(t).ids[-64:] for t in texts]
    with Harness(config.target, config.draft, max_sessions=config.sessions + 8, progress=progress) as harness:
        info = harness.info
        probe_latency: dict[str, list[float]] = {"before": [], "during": [], "after": []}
        phase = ["before"]
        stop = threading.Event()
        rss = {"samples": []}

        def probe():
            """One session doing k-draft rounds the whole time (its round latency), and the
            replica's RSS every few rounds."""
            import queue

            with grpc.insecure_channel(harness.server) as channel:
                stub = pb_grpc.SpeculativeStub(channel)
                while not stop.is_set():
                    requests: queue.Queue = queue.Queue()
                    replies = stub.Session(iter(requests.get, None), metadata=metadata, timeout=600)
                    requests.put(pb.SessionRequest(open=pb.Open(
                        prompt_ids=prompts[0], mode=pb.VERIFY_MODE_GREEDY, tokenizer_fingerprint=info.tokenizer_fingerprint,
                        max_new_tokens=400)))
                    next(replies)
                    for r in range(100):
                        if stop.is_set():
                            break
                        started = time.perf_counter()
                        requests.put(pb.SessionRequest(draft=pb.Draft(round=r, token_ids=[1] * config.k)))
                        verdict = next(replies).verdict
                        probe_latency[phase[0]].append((time.perf_counter() - started) * 1000)
                        if r % 10 == 0:
                            rss["samples"].append(stub.Info(pb.InfoRequest(), metadata=metadata, timeout=30).replica_rss_bytes)
                        if verdict.finished:
                            break
                        time.sleep(0.05)
                    requests.put(pb.SessionRequest(close=pb.Close()))
                    requests.put(None)
                    for _ in replies:
                        pass

        thread = threading.Thread(target=probe, daemon=True)
        thread.start()
        time.sleep(3)
        rss_before = statistics.median(rss["samples"][-5:]) if rss["samples"] else 0
        progress(f"load: {config.sessions} sessions x {config.rounds} rounds of k={config.k} random drafts")
        phase[0] = "during"

        async def all_sessions():
            async with grpc.aio.insecure_channel(harness.server) as channel:
                stub = pb_grpc.SpeculativeStub(channel)
                return await asyncio.gather(*(
                    _raw_session(stub, info.tokenizer_fingerprint, info.vocab_size, prompts[i % len(prompts)], config.k,
                                 config.rounds, i, metadata) for i in range(config.sessions)))

        started = time.perf_counter()
        outputs = sdk_loop.run(all_sessions())
        wall = time.perf_counter() - started
        phase[0] = "after"
        time.sleep(5)
        stop.set()
        thread.join(timeout=60)
        rss_after = statistics.median(rss["samples"][-5:]) if rss["samples"] else 0
    progress("load: checking every output against the target's own greedy generation")
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(str(config.target), dtype=torch.float32).eval()
    exact = 0
    references = {}
    for i, output in enumerate(outputs):
        prompt = prompts[i % len(prompts)]
        if len(output) not in references.setdefault(tuple(prompt), {}):
            with torch.inference_mode():
                ids = model.generate(torch.tensor([prompt]), max_new_tokens=len(output), min_new_tokens=len(output),
                                     do_sample=False, pad_token_id=0)
            references[tuple(prompt)][len(output)] = ids[0, len(prompt):].tolist()
        exact += output == references[tuple(prompt)][len(output)]
    return {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items() if k not in ("api_key", "prompts")},
        "sessions": config.sessions,
        "rounds": config.rounds,
        "outputs_exact": exact,
        "wall_s": wall,
        "rounds_per_s": config.sessions * config.rounds / wall,
        "probe_latency": {name: _latency(samples) for name, samples in probe_latency.items()},
        "replica_rss_bytes": {"before": rss_before, "peak": max(rss["samples"], default=0), "after": rss_after},
    }


@dataclass(frozen=True)
class KillConfig:
    target: Path
    draft: Path
    prompts: list[str]
    max_new_tokens: int = 300
    kill_after_tokens: int | None = None  # default: a third of max_new_tokens
    replicas: int = 2

    @property
    def kill_after(self) -> int:
        return self.kill_after_tokens if self.kill_after_tokens is not None else max(1, self.max_new_tokens // 3)


def _serving_replica() -> tuple[str, int]:
    """(endpoint, pid) of the replica holding the most sessions: the one the device streams to."""
    import grpc
    import psutil

    from edgespec.cloud.serving.app import APP_NAME
    from edgespec.cloud.serving.ingress import direct_endpoints
    from edgespec.v1 import speculative_pb2 as pb
    from edgespec.v1 import speculative_pb2_grpc as pb_grpc

    busiest, sessions = None, -1
    for endpoint in direct_endpoints(APP_NAME):
        with grpc.insecure_channel(endpoint) as channel:
            active = pb_grpc.SpeculativeStub(channel).Info(pb.InfoRequest(), timeout=10).active_sessions
        if active > sessions:
            busiest, sessions = endpoint, active
    port = int(busiest.rsplit(":", 1)[1])
    pid = next(c.pid for c in psutil.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN and c.laddr.port == port)
    return busiest, pid


def run_kill(config: KillConfig, progress: Callable[[str], None] = print) -> dict:
    """Needs an ingress with replica endpoints (haproxy, the default): the victim is found by its port."""
    import torch
    from transformers import AutoModelForCausalLM

    from edgespec.cloud.bench.harness import Harness
    from edgespec.edge.client import EdgeClient

    prompt = config.prompts[0]
    with Harness(config.target, config.draft, replicas=config.replicas, progress=progress) as harness:
        with EdgeClient(harness.server, config.draft, max_retries=20, timeout=30) as client:
            ids = client.encode(prompt)
            client.generate(ids, max_new_tokens=16, k=4)
            stream = client.stream(ids, max_new_tokens=config.max_new_tokens, k=4, send_ahead=1, stop_token_ids=())
            arrivals, killed_at, victim, raw = [], None, None, []
            for _ in stream:
                arrivals.append(time.perf_counter())
                if killed_at is None and len(stream.token_ids) >= config.kill_after:
                    raw = [_RawSession(harness.server, harness.info.tokenizer_fingerprint, ids) for _ in range(3)]
                    victim, pid = _serving_replica()
                    os.kill(pid, signal.SIGKILL)
                    killed_at = time.perf_counter()
                    progress(f"kill: SIGKILL to the replica at {victim} (pid {pid}) after {len(stream.token_ids)} tokens")
            result = stream.result
            raw_outcomes = [session.next_round() for session in raw]
    gaps = [(b - a, a) for a, b in zip(arrivals, arrivals[1:])]
    outage, at = max(gaps) if gaps else (0.0, 0.0)
    # Gaps between committed rounds, by phase: before the kill, the 2 s after it, the rest.
    phases: dict[str, list[float]] = {"before": [], "during": [], "after": []}
    for gap, start in gaps:
        phase = "before" if start < killed_at else "during" if start < killed_at + 2.0 else "after"
        phases[phase].append(gap * 1000)
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(str(config.target), dtype=torch.float32).eval()
    with torch.inference_mode():
        reference = model.generate(torch.tensor([ids]), max_new_tokens=config.max_new_tokens, min_new_tokens=config.max_new_tokens,
                                   do_sample=False, pad_token_id=0)[0, len(ids):].tolist()
    return {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items() if k != "prompts"},
        "victim": victim,
        "outage_s": outage,
        "outage_started_after_kill_s": at - killed_at if killed_at else None,
        "resumes": result.stats.resumes,
        "exact": result.token_ids == reference,
        "tokens": len(result.token_ids),
        "round_gap_ms": {name: _latency(samples) for name, samples in phases.items()},
        "raw_sessions_after_kill": raw_outcomes,  # what a client without the SDK's resume sees
    }


class _RawSession:
    """A raw Session opened before the kill; after it, one more round tells what a client that
    does not resume sees (a verdict if it lived on the other replica)."""

    def __init__(self, address: str, fingerprint: str, prompt: list[int]):
        import queue

        import grpc

        from edgespec.v1 import speculative_pb2 as pb
        from edgespec.v1 import speculative_pb2_grpc as pb_grpc

        self.pb, self.requests = pb, queue.Queue()
        self.channel = grpc.insecure_channel(address)
        self.replies = pb_grpc.SpeculativeStub(self.channel).Session(iter(self.requests.get, None), timeout=120)
        self.requests.put(pb.SessionRequest(open=pb.Open(prompt_ids=prompt, mode=pb.VERIFY_MODE_GREEDY,
                                                         tokenizer_fingerprint=fingerprint, max_new_tokens=64)))
        next(self.replies)

    def next_round(self) -> dict:
        import grpc

        started = time.perf_counter()
        try:
            self.requests.put(self.pb.SessionRequest(draft=self.pb.Draft(round=0, token_ids=[1, 2])))
            next(self.replies)
            outcome = {"status": "OK (the other replica)"}
        except grpc.RpcError as exc:
            outcome = {"status": exc.code().name, "details": exc.details()}
        self.requests.put(None)
        self.channel.close()
        return outcome | {"seconds": time.perf_counter() - started}


def write(report: dict, out: Path, name: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(report, indent=2, default=str))
    return path


__all__ = ["KillConfig", "LoadConfig", "run_kill", "run_load", "write"]
