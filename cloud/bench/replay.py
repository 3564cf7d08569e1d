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
import contextlib
import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Callable, Iterable

from edgespec.cloud.bench.connection import connection_to
from edgespec.edge.params import Mode, SamplingParams
from edgespec.edge.wire import generate_request, open_request
from edgespec.v1 import speculative_pb2 as pb
from edgespec.v1 import speculative_pb2_grpc as pb_grpc
from edgespec.edge import loop as sdk_loop


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
    cloud_only_batch_mean: float = 0.0  # the replica's decoding batches (GenerateResponse.batch_size)
    cloud_only_step_ms: float = 0.0  # their mean step (GenerateResponse.step_ms), per forward
    cloud_only_step_median_ms: float = 0.0  # the median reply's step at the most common batch (as probes read it)

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


def acceptance_by_position(scripts: list[Script], k: int) -> tuple[float, ...]:
    """P(the draft at position i is accepted | all before it were) over the scripts' rounds at a
    fixed k: the rounds a greedy device drafting k at a time goes through (the replay's, and the
    real client's with k fixed), so the simulator can be given the workload's own acceptance."""
    drafted, accepted = [0] * k, [0] * k
    for script in scripts:
        p, budget = 0, len(script.output)
        while p < budget:
            size = min(k, budget - p - 1) if budget - p > 1 else 1
            n = 0
            while n < size and p + n < len(script.predicted) and script.predicted[p + n] == script.output[p + n]:
                n += 1
            for i in range(min(n + 1, size)):  # positions 0..n were drafted given all before passed
                drafted[i] += 1
                accepted[i] += i < n
            p += n + 1
    return tuple(a / d if d else 0.0 for a, d in zip(accepted, drafted))


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


async def _cloud_only(stub, fingerprint: str, script: Script, metadata,
                      steps: list[tuple[int, float]] | None = None,
                      gaps: list[tuple[int, float, float]] | None = None) -> tuple[int, float, float]:
    """One raw Generate stream: (tokens, seconds to the last, seconds to the first). ``steps``,
    if given, gets each reply's (batch_size, step_ms): the replica's decoding forward behind it;
    ``gaps`` each later reply's (batch_size, step_ms, ms since the stream's previous reply)."""
    request = generate_request(script.prompt_ids, GREEDY, fingerprint, max_new_tokens=len(script.output), stop_token_ids=())
    started = time.perf_counter()
    count, first, last = 0, 0.0, 0.0
    async for reply in stub.Generate(request, metadata=metadata):
        now = time.perf_counter()
        count += len(reply.token_ids)
        if gaps is not None and first:
            gaps.append((reply.batch_size, reply.step_ms, 1000.0 * (now - last)))
        first, last = first or now - started, now
        if steps is not None:
            steps.append((reply.batch_size, reply.step_ms))
    return count, time.perf_counter() - started, first


def raw_streams(address: str, fingerprint: str, scripts: list[Script], *, at_once: bool = False,
                steps: list[tuple[int, float]] | None = None,
                gaps: list[tuple[int, float, float]] | None = None) -> list[tuple[int, float, float]]:
    """The scripts' prompts as raw Generate streams (``_cloud_only`` each): one after another,
    or all at once, one connection each. ``steps`` collects every reply's (batch_size, step_ms),
    ``gaps`` every later reply's (batch_size, step_ms, ms since the stream's previous reply)."""
    metadata = connection_to(address).metadata()
    if at_once:
        return sdk_loop.run(_at_once(address, scripts,
                                    lambda stub, script: _cloud_only(stub, fingerprint, script, metadata, steps, gaps)))[0]

    async def run():
        async with connection_to(address).aio_channel(address) as channel:
            await channel.channel_ready()  # connected before the first stream's clock starts, as at once
            stub = pb_grpc.SpeculativeStub(channel)
            return [await _cloud_only(stub, fingerprint, script, metadata, steps, gaps) for script in scripts]

    return sdk_loop.run(run())


async def _at_once(address: str, scripts: list[Script], call) -> tuple[list, float]:
    """``call(stub, script)`` for every script at once, one connection per device, as real
    devices have: through the link emulator each then gets its own emulated link (one shared
    connection would put all of them on one link, in order, sharing its jitter and its
    head-of-line delays). Returns the results and the wall time."""
    async with contextlib.AsyncExitStack() as stack:
        channels = [await stack.enter_async_context(connection_to(address).aio_channel(address)) for _ in scripts]
        await asyncio.gather(*(channel.channel_ready() for channel in channels))  # connected before the clock starts
        started = time.perf_counter()
        results = await asyncio.gather(*(call(pb_grpc.SpeculativeStub(c), s) for c, s in zip(channels, scripts)))
        return results, time.perf_counter() - started


def measure_replay(address: str, fingerprint: str, scripts: list[Script], sessions: int, k: int, *,
                   api_key: str | None = None, cloud_first: bool = True,
                   between: Callable[[], object] | None = None) -> ReplayRow:
    """``sessions`` replayed devices at once, then (or first) as many cloud-only streams;
    ``between``, if given, is called between the two arms (a probe of the replica's load)."""
    metadata = (("authorization", f"Bearer {api_key}"),) if api_key else connection_to(address).metadata()
    chosen = [scripts[i % len(scripts)] for i in range(sessions)]
    steps: list[tuple[int, float]] = []

    async def arm(speculative: bool):
        if speculative:
            return await _at_once(address, chosen, lambda stub, script: _speculative(stub, fingerprint, script, k, metadata))
        return await _at_once(address, chosen, lambda stub, script: _cloud_only(stub, fingerprint, script, metadata, steps))

    arms = {}
    for i, speculative in enumerate((False, True) if cloud_first else (True, False)):
        if i and between is not None:
            between()
        arms[speculative] = sdk_loop.run(arm(speculative))
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
        **_forward_means(steps),
    )


def _forward_means(steps: list[tuple[int, float]]) -> dict[str, float]:
    """Mean batch and step over the forwards behind replies (a forward of b rows is in b replies)."""
    forwards = sum(1.0 / b for b, _ in steps if b > 0)
    if not forwards:
        return {}
    _, median = step_at_common_batch(steps) or (0, 0.0)
    return {"cloud_only_batch_mean": sum(1.0 for b, _ in steps if b > 0) / forwards,
            "cloud_only_step_ms": sum(ms / b for b, ms in steps if b > 0) / forwards,
            "cloud_only_step_median_ms": median}


def step_at_common_batch(steps: Iterable[tuple[int, float]], least: int = 1) -> tuple[int, float] | None:
    """The most common batch of at least ``least`` rows among replies' (batch_size, step_ms)
    (the larger on a tie) and the median reply's step at it; None without such a reply."""
    steps = [(b, ms) for b, ms in steps if b >= least]
    if not steps:
        return None
    counts = Counter(b for b, _ in steps)
    common = max(counts, key=lambda b: (counts[b], b))
    return common, statistics.median(ms for b, ms in steps if b == common)
