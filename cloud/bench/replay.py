"""Replica capacity with the devices' drafting off this machine: replayed devices.

On one machine, N real devices (``capacity.measure``: N SDK clients, each with its own ONNX
draft) draft on the cores the replica verifies on, in one Python process: at 16 sessions the
clients' own CPU, not the replica, sets the pace. A real fleet drafts on its own phones.

A replayed device sends, round by round, exactly the verdict-relevant drafts the real device
would: greedy drafting of a context the target wrote is deterministic, so the draft is run once
over the target's greedy output (``DraftModel.observe``: its prediction at every position,
lookup included) and a round at position p drafts ``pred[p:p+k]``. The first L of those equal
the target's tokens exactly where the real device's chain would (the chain follows the target's
tokens while it matches), position L is the real device's first wrong draft, and what follows
is never accepted, so the verifier accepts the same L and emits the same token. Each replayed
session checks every token it commits against the target's output.

Cloud-only devices are raw Generate streams. Both arms run through the same address (a link
emulator when one is in use), one after the other, the same sessions and prompts.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass

import grpc

from edgespec.edge.params import Mode, SamplingParams
from edgespec.edge.wire import generate_request, open_request
from edgespec.v1 import speculative_pb2 as pb
from edgespec.v1 import speculative_pb2_grpc as pb_grpc


GREEDY = SamplingParams()


@dataclass(frozen=True)
class Script:
    """One prompt's replay: the target's greedy output and the draft's prediction at each of its tokens."""

    prompt_ids: list[int]
    output: list[int]
    predicted: list[int]


@dataclass
class ReplayRow:
    sessions: int
    k: int
    speculative_tokens_per_s: float
    cloud_only_tokens_per_s: float
    speculative_ms_per_token: float  # per session
    cloud_only_ms_per_token: float
    tau: float
    batch_size_mean: float
    exact: bool  # every replayed session committed exactly the target's output

    @property
    def gain(self) -> float:
        return self.speculative_tokens_per_s / self.cloud_only_tokens_per_s if self.cloud_only_tokens_per_s else 0.0

    def to_dict(self) -> dict:
        return asdict(self) | {"gain": self.gain}


def make_scripts(client, prompts: list[str], max_new_tokens: int) -> list[Script]:
    """The target's output for each prompt (cloud-only, through the server) and the draft's
    predictions over it (``client``: an ``EdgeClient``; its draft, lookup on)."""
    from edgespec.edge.lookup import LookupConfig

    scripts = []
    draft = client.draft.fork()
    for prompt in prompts:
        ids = client.encode(prompt)
        output = client.generate_cloud(ids, max_new_tokens=max_new_tokens, stop_token_ids=()).token_ids
        draft.reset(ids)
        scripts.append(Script(ids, output, draft.observe(output, LookupConfig())))
    return scripts


async def _speculative(stub, fingerprint: str, script: Script, k: int, metadata) -> tuple[int, int, float, list[int], bool]:
    requests: asyncio.Queue = asyncio.Queue()

    async def feed():
        while (item := await requests.get()) is not None:
            yield item

    call = stub.Session(feed(), metadata=metadata)
    replies = call.__aiter__()
    budget = len(script.output)
    await requests.put(open_request(script.prompt_ids, GREEDY, Mode.GREEDY, fingerprint, max_new_tokens=budget,
                                      stop_token_ids=(), first_round=0))
    started = time.perf_counter()
    assert (await replies.__anext__()).HasField("opened")
    committed: list[int] = []
    rounds, batches = 0, []
    while len(committed) < budget:
        p = len(committed)
        size = min(k, budget - p - 1) if budget - p > 1 else 1
        drafts = (script.predicted[p : p + size] + [0] * size)[:size]
        await requests.put(pb.SessionRequest(draft=pb.Draft(round=rounds, token_ids=drafts)))
        verdict = (await replies.__anext__()).verdict
        committed += drafts[: verdict.accepted] + [verdict.next_token]
        rounds += 1
        batches.append(verdict.batch_size)
        if verdict.finished:
            break
    elapsed = time.perf_counter() - started
    await requests.put(pb.SessionRequest(close=pb.Close()))
    await requests.put(None)
    async for _ in replies:
        pass
    return len(committed), rounds, elapsed, batches, committed == script.output[: len(committed)]


async def _cloud_only(stub, fingerprint: str, script: Script, metadata) -> tuple[int, float]:
    request = generate_request(script.prompt_ids, GREEDY, fingerprint, max_new_tokens=len(script.output), stop_token_ids=())
    started = time.perf_counter()
    count = 0
    async for reply in stub.Generate(request, metadata=metadata):
        count += len(reply.token_ids)
    return count, time.perf_counter() - started


def measure_replay(address: str, fingerprint: str, scripts: list[Script], sessions: int, k: int, *,
                   api_key: str | None = None, cloud_first: bool = True) -> ReplayRow:
    """``sessions`` replayed devices at once, then (or first) as many cloud-only streams."""
    metadata = (("authorization", f"Bearer {api_key}"),) if api_key else None
    chosen = [scripts[i % len(scripts)] for i in range(sessions)]

    async def arm(speculative: bool):
        async with grpc.aio.insecure_channel(address) as channel:
            stub = pb_grpc.SpeculativeStub(channel)
            started = time.perf_counter()
            if speculative:
                results = await asyncio.gather(*(_speculative(stub, fingerprint, s, k, metadata) for s in chosen))
            else:
                results = await asyncio.gather(*(_cloud_only(stub, fingerprint, s, metadata) for s in chosen))
            return results, time.perf_counter() - started

    async def both():
        order = (False, True) if cloud_first else (True, False)
        return {speculative: await arm(speculative) for speculative in order}

    arms = asyncio.run(both())
    (spec, spec_wall), (cloud, cloud_wall) = arms[True], arms[False]
    spec_tokens = sum(r[0] for r in spec)
    rounds = sum(r[1] for r in spec)
    batches = [b for r in spec for b in r[3]] or [0]
    return ReplayRow(
        sessions=sessions, k=k,
        speculative_tokens_per_s=spec_tokens / spec_wall,
        cloud_only_tokens_per_s=sum(r[0] for r in cloud) / cloud_wall,
        speculative_ms_per_token=sum(r[2] * 1000 / max(r[0], 1) for r in spec) / len(spec),
        cloud_only_ms_per_token=sum(r[1] * 1000 / max(r[0], 1) for r in cloud) / len(cloud),
        tau=spec_tokens / rounds if rounds else 0.0,
        batch_size_mean=sum(batches) / len(batches),
        exact=all(r[4] for r in spec),
    )
