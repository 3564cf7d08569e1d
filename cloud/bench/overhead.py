"""``edgespec bench overhead``: the replica's own CPU per verify message, by phase.

Serves a target whose forward costs almost nothing (a 1-layer, 16-wide random Llama built on
the fly with ``cloud/training/tiny.py``), drives N concurrent raw greedy sessions (k random
drafts a round) through the real Serve gRPC ingress, and reads the replica's CPU ledger
(``cloud/serving/cpu_ledger.py``, through a Serve handle) before and after the measured rounds.
Every session opens and warms up first, and closes after: the window holds verify messages only.

Per message = (replica process CPU - forward CPU) / verify messages. The phases the ledger
names are subtracted from it; what remains is ``ingress`` (Serve's gRPC server and request
wrappers, asyncio, Serve's own threads). HAProxy (the default ingress) runs in its own process
and is not counted. The last line printed is ``per-message CPU <N> us``.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Callable

import grpc

from edgespec.cloud.serving.cpu_ledger import PHASES
from edgespec.edge import loop as sdk_loop


def build_featherweight_target(out: Path) -> Path:
    """The 1-layer, 16-wide random Llama (reused when already built)."""
    import torch
    from transformers import LlamaForCausalLM

    from edgespec.cloud.training.tiny import corpus_text, save_tokenizer, tiny_llama_config, train_tokenizer

    if (out / "config.json").is_file():
        return out
    tokenizer = train_tokenizer(corpus_text(), 512)
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(tokenizer.get_vocab_size(), layers=1, hidden=16)).eval()
    model.save_pretrained(str(out))
    save_tokenizer(tokenizer, out)
    return out


async def _session(stub, pb, info, k: int, warmup: int, rounds: int, seed: int, start: asyncio.Barrier,
                   end: asyncio.Barrier, out: dict) -> None:
    rng = random.Random(seed)
    call = stub.Session()
    prompt = [rng.randrange(1, info.vocab_size) for _ in range(16)]
    total = warmup + rounds
    await call.write(pb.SessionRequest(open=pb.Open(prompt_ids=prompt, mode=pb.VERIFY_MODE_GREEDY,
                                                    tokenizer_fingerprint=info.tokenizer_fingerprint, max_new_tokens=total * (k + 1))))
    await call.read()
    for round_no in range(total):
        if round_no == warmup:
            await start.wait()
        drafts = [rng.randrange(1, info.vocab_size) for _ in range(k)]
        await call.write(pb.SessionRequest(draft=pb.Draft(round=round_no, token_ids=drafts)))
        verdict = (await call.read()).verdict
        if round_no >= warmup:
            out["batch"].append(verdict.batch_size)
    await end.wait()
    await call.write(pb.SessionRequest(close=pb.Close()))
    await call.done_writing()


async def _drive(address: str, sessions: int, k: int, warmup: int, rounds: int, read_stats: Callable[[], dict]) -> dict:
    from edgespec.v1 import speculative_pb2 as pb
    from edgespec.v1 import speculative_pb2_grpc as pb_grpc

    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.SpeculativeStub(channel)
        info = await stub.Info(pb.InfoRequest(), timeout=60)
        out: dict = {"batch": []}
        stats: dict = {}

        async def snapshot(name: str) -> None:
            stats[name] = await asyncio.to_thread(read_stats)
            stats[name + "_wall"] = time.perf_counter()

        start = asyncio.Barrier(sessions + 1)
        end = asyncio.Barrier(sessions + 1)
        tasks = [asyncio.create_task(_session(stub, pb, info, k, warmup, rounds, s, start, end, out)) for s in range(sessions)]
        while start.n_waiting < sessions:  # every session opened and warmed up
            await asyncio.sleep(0.05)
        await snapshot("before")
        await start.wait()
        while end.n_waiting < sessions:
            await asyncio.sleep(0.01)
        await snapshot("after")
        await end.wait()
        await asyncio.gather(*tasks)
    return {**stats, "batch": out["batch"]}


def measure(address: str, sessions: int, k: int, warmup: int, rounds: int, read_stats: Callable[[], dict]) -> dict:
    """Runs the sessions; returns per-message CPU (us) by phase, ``ingress`` the rest, and ``total``."""
    result = sdk_loop.run(_drive(address, sessions, k, warmup, rounds, read_stats))
    before, after = result["before"], result["after"]
    messages = after["messages"] - before["messages"]
    phase_us = {name: (after["phases"].get(name, 0) - before["phases"].get(name, 0)) / messages / 1000 for name in PHASES}
    process_us = (after["process_ns"] - before["process_ns"]) / messages / 1000
    total = process_us - phase_us["forward"]
    named = sum(v for name, v in phase_us.items() if name != "forward")
    wall = result["after_wall"] - result["before_wall"]
    return {"messages": messages, "phases": phase_us, "ingress": total - named, "total": total,
            "batch_mean": sum(result["batch"]) / max(len(result["batch"]), 1), "messages_per_s": messages / wall}


def run_overhead(*, sessions: int, rounds: int, k: int, work: Path, progress: Callable[[str], None]) -> int:
    import torch

    torch.set_num_threads(1)
    from edgespec.cloud.bench.harness import free_port
    from edgespec.cloud.serving.app import APP_NAME, init_ray, serve_verifier, stop_serving
    from edgespec.cloud.serving.config import DeploymentOptions, VerifierConfig

    target = build_featherweight_target(work / "featherweight-target")
    # init_ray claims HAProxy's stats and metrics ports free for this run (haproxy_owner.py)
    init_ray(num_cpus=2, log_to_driver=False)
    from ray import serve  # after init_ray: the ingress is chosen before Ray is imported
    config = VerifierConfig(model=str(target), device="cpu", torch_threads=1, max_sessions=sessions + 4, max_batch_size=sessions,
                            max_new_tokens=100_000, batch_wait_timeout_s=0.002, profile_cpu=True)
    port = free_port()
    address = serve_verifier(config, DeploymentOptions(num_cpus=0.5, graceful_shutdown_timeout_s=1.0), grpc_port=port,
                             http_port=free_port(), timeout_s=300, progress=progress)
    handle = serve.get_app_handle(APP_NAME)
    try:
        result = measure(address, sessions, k, warmup=5, rounds=rounds,
                         read_stats=lambda: handle.cpu_stats.remote().result(timeout_s=60))
    finally:
        stop_serving()  # (not serve.shutdown(): it waits 30 s on HAProxy's controller)
    phases = result["phases"]
    progress(f"overhead: {sessions} sessions x {rounds} rounds, k={k}, 1-layer 16-wide target, {result['messages']} verify "
             f"messages, mean batch {result['batch_mean']:.1f}, {result['messages_per_s']:.0f} messages/s")
    progress("replica CPU per verify message (us):")
    for name in ("decode", "validation", "scheduling", "bookkeeping", "encode"):
        progress(f"  {name:<12} {phases[name]:8.1f}")
    progress(f"  {'ingress':<12} {result['ingress']:8.1f}   (Serve's gRPC ingress, asyncio, other threads: the rest)")
    progress(f"  {'forward':<12} {phases['forward']:8.1f}   (the target forward: not counted)")
    print(f"per-message CPU {result['total']:.0f} us", flush=True)
    return 0
