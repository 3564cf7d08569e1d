"""The driver loop against the scripted verifier (a real gRPC server), with a drafter that needs
no model (lookup only) and a scripted clock: fast, and every time reading is the clock's."""

from __future__ import annotations

import asyncio
import itertools
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import grpc
import pytest
from conformance.scripted_verifier import SCENARIOS, serve

from edgespec.edge.driver import Generation
from edgespec.edge.params import GenerationParams
from edgespec.edge.planner import Info
from edgespec.edge.types import ServerInfo
from edgespec.v1 import speculative_pb2_grpc as pb_grpc

VOCAB = 64
MODEL = SimpleNamespace(manifest=SimpleNamespace(max_positions=512, tokenizer_fingerprint="fp"), tokenizer=None,
                        vocab_size=VOCAB, eos_token_ids=[VOCAB - 1])
INFO = ServerInfo(model_id="scripted", tokenizer_fingerprint="fp", vocab_size=VOCAB, max_context=4096, max_k=8,
                  max_new_tokens=1024, modes=("greedy",), version="scripted-1", send_ahead=True)


@pytest.fixture(scope="module")
def verifier():
    server, verifier, port = serve("fp", VOCAB)
    yield verifier, f"127.0.0.1:{port}"
    server.stop(grace=None)


def generate(address: str, scenario, clock, **params) -> Generation:
    async def go() -> Generation:
        async with grpc.aio.insecure_channel(address) as channel:
            with ThreadPoolExecutor(1) as draft_thread:
                gen = Generation(pb_grpc.SpeculativeStub(channel), MODEL, draft_thread, scenario.prompt,
                                 GenerationParams(max_new_tokens=scenario.max_new_tokens, stop_token_ids=[VOCAB - 1],
                                                  lookup="only", **params),
                                 INFO, timeout=10, max_retries=2, clock=clock)
                async for _ in gen.chunks():
                    pass
                return gen

    return asyncio.run(go())


@pytest.mark.parametrize("name", ["all_accepted", "reject_at_2", "discarded_ahead", "ahead_kept", "resume_after_cut",
                                  "drain_reopen", "budget_edge", "stop_token"])
def test_the_driver_commits_what_the_verifier_committed(verifier, name):
    scripted, address = verifier
    scenario = next(s for s in SCENARIOS if s.name == name)
    gen = generate(address, scenario, clock=__import__("time").perf_counter, k=4, speculate=True,
                   send_ahead=scenario.send_ahead)
    record = scripted.report()[name]
    assert record["violations"] == []
    assert gen.generated == record["committed"] and gen.finish_reason == record["finish_reason"]
    assert gen.segments == [("speculative", len(record["committed"]))]


def test_every_time_reading_goes_through_the_clock(verifier):
    scripted, address = verifier
    scenario = next(s for s in SCENARIOS if s.name == "reject_at_0")
    ticks = itertools.count()
    gen = generate(address, scenario, clock=lambda: next(ticks) * 0.5, k=2, speculate=True, send_ahead=1)
    assert gen.generated == scripted.report()[scenario.name]["committed"]
    readings = [gen.stats.wall_s, gen.stats.first_token_s, gen.stats.draft_s, gen.stats.wait_s]
    readings += [value for r in gen.rounds for value in (r.draft_ms, r.wait_ms, r.wall_ms)]
    assert all((value / 0.5) == int(value / 0.5) for value in readings)  # whole ticks: no other clock was read
    assert gen.stats.wall_s > 0 and all(r.wall_ms >= 500 for r in gen.rounds)


def test_cloud_only_is_one_path_of_the_same_loop(verifier):
    scripted, address = verifier
    scenario = next(s for s in SCENARIOS if s.name == "cloud_resume")
    gen = generate(address, scenario, clock=__import__("time").perf_counter, speculate=False)
    record = scripted.report()[scenario.name]
    assert record["violations"] == [] and gen.generated == record["committed"]
    assert gen.segments == [("cloud_only", scenario.max_new_tokens)] and gen.stats.resumes == 1


class _ProbedPlanner:
    """What a probe tells the planner, in order (a stand-in that keeps the events)."""

    def __init__(self):
        self.events: list = []

    def observe(self, event) -> None:
        self.events.append(event)


def _probe_once(streaming: bool, monkeypatch) -> list[tuple]:
    from edgespec.edge import driver
    from edgespec.edge.types import ReplicaProbe

    monkeypatch.setattr(driver, "RTT_PROBE_INTERVAL_S", 3600.0)
    planner = _ProbedPlanner()
    probes: list[float] = []

    async def probe() -> ReplicaProbe:
        probes.append(1.0)
        return ReplicaProbe(42.0, 15.0, 9.0, 11.5)

    async def go() -> None:
        owner = SimpleNamespace(planner=planner)
        task = asyncio.create_task(Generation._probe(owner, probe, streaming=streaming))  # type: ignore[arg-type]
        try:
            while not planner.events:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)  # a probe that loops would not have slept an hour yet: none more
            assert task.done() is not streaming  # beside rounds it returns; beside a stream it sleeps on
        finally:
            task.cancel()

    asyncio.run(asyncio.wait_for(go(), 10))
    assert len(probes) == 1
    return planner.events


def test_a_stream_probes_the_round_trip_at_its_start(monkeypatch):
    """A cloud-only segment may be left only once it has a probe: the first goes with the stream,
    not an interval later (a 5G stream could not come back for its first ~40 tokens). It brings the
    replica's forward, which no round measures while streaming, and its stream figures."""
    assert _probe_once(True, monkeypatch) == [Info(forward_ms=15.0, decode_ms=9.0, stream_ms=11.5, rtt_ms=42.0)]


def test_a_speculative_segment_probes_the_replica_once_for_its_stream_figures(monkeypatch):
    """Beside rounds, which measure the round trip and the forward themselves, one probe tells the
    replica's current stream figures: what moves the price of a stream measured on another load."""
    assert _probe_once(False, monkeypatch) == [Info(forward_ms=0.0, decode_ms=9.0, stream_ms=11.5, rtt_ms=None)]
