"""The replica gives a session's slot back before the reply that ends it leaves: a device that
opens its next session the moment it reads Closed (or a stream's last token) must find the slot
free. The deployment class is driven directly (no Serve), so the order is checked exactly: its
generator is not resumed after that reply, as Serve may not resume it before the device's next
Open arrives."""

from __future__ import annotations

import asyncio

import pytest

from edgespec.cloud.serving.deployment import VerifierDeployment
from edgespec.v1 import speculative_pb2 as pb

pytestmark = pytest.mark.slow  # loads a (tiny) target


@pytest.fixture(scope="module")
def replica(tiny_pair):
    return VerifierDeployment.func_or_class({"model": str(tiny_pair.target_dir), "max_sessions": 1})


def test_closed_arrives_with_the_slot_already_free(replica):
    async def run():
        info = await replica.Info(pb.InfoRequest())

        async def requests():
            yield pb.SessionRequest(open=pb.Open(prompt_ids=[5, 6, 7], mode=pb.VERIFY_MODE_GREEDY,
                                                 tokenizer_fingerprint=info.tokenizer_fingerprint, max_new_tokens=8))
            yield pb.SessionRequest(draft=pb.Draft(round=0, token_ids=[1, 2]))
            yield pb.SessionRequest(close=pb.Close())

        seen = []
        async for reply in replica.Session(requests()):
            seen.append((reply.WhichOneof("kind"), replica.admission.active))
            if reply.HasField("closed"):
                break  # the generator is never resumed past Closed
        return seen

    assert asyncio.run(run()) == [("opened", 1), ("verdict", 1), ("closed", 0)]


def test_a_streams_last_token_arrives_with_the_slot_already_free(replica):
    async def run():
        seen = []
        async for reply in replica.Generate(pb.GenerateRequest(prompt_ids=[5, 6, 7], max_new_tokens=3)):
            seen.append((reply.finished, replica.admission.active))
            if reply.finished:
                break
        return seen

    seen = asyncio.run(run())
    assert seen[-1][1] == 0 and all(active == 1 for _, active in seen[:-1]), seen


def test_an_ended_session_is_no_longer_expected_back(replica):
    # The gather expects a session back (scheduler.ReturnTimes) until the replica releases it.
    async def run():
        info = await replica.Info(pb.InfoRequest())

        async def requests():
            yield pb.SessionRequest(open=pb.Open(prompt_ids=[5, 6, 7], mode=pb.VERIFY_MODE_GREEDY,
                                                 tokenizer_fingerprint=info.tokenizer_fingerprint, max_new_tokens=8))
            for round_no in range(2):
                yield pb.SessionRequest(draft=pb.Draft(round=round_no, token_ids=[1, 2]))

        tracked = []
        async for reply in replica.Session(requests()):
            if reply.HasField("verdict"):
                tracked.append(len(replica.batches.returns.away(1, [])))
        return tracked

    assert asyncio.run(run()) == [1, 1]  # while it is open: tracked, away
    assert replica.batches.returns.away(0, []) == []  # the stream ended: forgotten
