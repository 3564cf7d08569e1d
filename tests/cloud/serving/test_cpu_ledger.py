"""The CPU ledger behind ``bench overhead``: a hook that wraps the methods it times. Off, the
replica's methods are its own; on, a verify message charges thread CPU to every phase."""

from __future__ import annotations

import asyncio

import pytest

from edgespec.cloud.serving.cpu_ledger import DEPLOYMENT_PHASES, PHASES, QUOTA_PHASES, SCHEDULER_PHASES, CpuLedger
from edgespec.cloud.serving.deployment import VerifierDeployment
from edgespec.v1 import speculative_pb2 as pb

from helpers.raw import open_msg


def _work(n: int = 20_000) -> int:
    return sum(i * i for i in range(n))


def test_a_timed_method_charges_its_cpu_to_its_phase_and_an_encode_counts_a_message():
    ledger = CpuLedger()
    assert ledger.timed("decode", _work)() == _work()
    ledger.timed("encode", lambda: None)()
    snapshot = ledger.snapshot()
    assert snapshot["phases"]["decode"] > 0 and "encode" in snapshot["phases"]
    assert snapshot["messages"] == 1 and snapshot["process_ns"] > 0


def test_a_timed_method_that_raises_is_still_charged():
    ledger = CpuLedger()

    def fails():
        _work()
        raise ValueError("refused")

    with pytest.raises(ValueError):
        ledger.timed("validation", fails)()
    assert ledger.ns["validation"] > 0


def _session(replica) -> None:
    async def run():
        info = await replica.Info(pb.InfoRequest())

        async def requests():
            yield pb.SessionRequest(open=open_msg(info, max_new_tokens=8))
            yield pb.SessionRequest(draft=pb.Draft(round=0, token_ids=[1, 2]))
            yield pb.SessionRequest(close=pb.Close())

        async for _ in replica.Session(requests()):
            pass

    asyncio.run(run())


@pytest.mark.slow
@pytest.mark.parametrize("profile", [False, True])
def test_profiling_off_installs_nothing_and_on_charges_every_phase(tiny_pair, profile):
    replica = VerifierDeployment.func_or_class({"model": str(tiny_pair.target_dir), "profile_cpu": profile})
    owners = ((replica, DEPLOYMENT_PHASES), (replica.admission.quotas, QUOTA_PHASES), (replica.batches, SCHEDULER_PHASES))
    wrapped = {name for owner, methods in owners for name in methods if name in vars(owner)}
    wrapped |= {"_step"} & set(vars(replica))
    _session(replica)
    stats = replica.cpu_stats()
    if not profile:
        assert not wrapped and stats["messages"] == 0 and stats["phases"] == {}
        return
    assert len(wrapped) == sum(len(methods) for _, methods in owners) + 1
    assert stats["messages"] == 1
    assert all(stats["phases"].get(phase, 0) > 0 for phase in PHASES), stats["phases"]
