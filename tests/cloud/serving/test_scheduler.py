"""The batch scheduler: gathers once the model is free, never makes a lone session wait,
respects the batch cap, and hands one failure to every caller of the batch."""

from __future__ import annotations

import asyncio
import time

import pytest

from edgespec.cloud.serving.scheduler import BatchScheduler


def make(expected: int, *, wait_s=0.05, max_batch_size=8, forward_s=0.03, fail=False):
    batches: list[list[int]] = []

    async def run(items):
        batches.append(list(items))
        await asyncio.sleep(forward_s)
        if fail:
            raise RuntimeError("forward failed")
        return [item * 10 for item in items]

    return BatchScheduler(run, max_batch_size=max_batch_size, wait_s=wait_s, expected=lambda: expected), batches


async def closed_loop(scheduler, session: int, rounds: int, think_s: float) -> list[int]:
    out = []
    for r in range(rounds):
        out.append(await scheduler.submit(session * 100 + r))
        await asyncio.sleep(think_s * (1 + session % 3))  # sessions come back at different times
    return out


def test_closed_loop_sessions_share_forwards():
    async def main():
        scheduler, batches = make(expected=4)
        results = await asyncio.gather(*(closed_loop(scheduler, s, 8, 0.004) for s in range(4)))
        return results, batches

    results, batches = asyncio.run(main())
    for session, out in enumerate(results):
        assert out == [(session * 100 + r) * 10 for r in range(8)]
    sizes = [len(b) for b in batches]
    # Without gathering after the model frees up, these sessions convoy into batches of ~2.
    assert sum(sizes) / len(sizes) >= 3.0, sizes


def test_lone_session_never_waits():
    async def main():
        scheduler, _ = make(expected=1, wait_s=0.5, forward_s=0.0)
        started = time.perf_counter()
        for r in range(5):
            await scheduler.submit(r)
        return time.perf_counter() - started

    assert asyncio.run(main()) < 0.25  # five rounds, none waiting the 0.5 s window


def test_batch_cap_and_wait_bound():
    async def main():
        scheduler, batches = make(expected=10, wait_s=0.02, max_batch_size=3, forward_s=0.01)
        await asyncio.gather(*(scheduler.submit(i) for i in range(7)))
        return batches

    batches = asyncio.run(main())
    assert all(len(b) <= 3 for b in batches)
    assert sorted(i for b in batches for i in b) == list(range(7))


def test_one_failure_reaches_every_caller():
    async def main():
        scheduler, _ = make(expected=3, fail=True)
        return await asyncio.gather(*(scheduler.submit(i) for i in range(3)), return_exceptions=True)

    outcomes = asyncio.run(main())
    assert all(isinstance(o, RuntimeError) for o in outcomes)


def test_invalid_settings():
    with pytest.raises(ValueError):
        BatchScheduler(None, max_batch_size=0, wait_s=0, expected=lambda: 1)
    with pytest.raises(ValueError):
        BatchScheduler(None, max_batch_size=1, wait_s=-1, expected=lambda: 1)


def test_a_result_that_is_an_exception_reaches_only_its_caller():
    async def run(items):
        return [ValueError(f"row {item} failed") if item == 2 else item * 10 for item in items]

    async def main():
        scheduler = BatchScheduler(run, max_batch_size=8, wait_s=0.05, expected=lambda: 3)
        return await asyncio.gather(*(scheduler.submit(i) for i in (1, 2, 3)), return_exceptions=True)

    one, two, three = asyncio.run(main())
    assert (one, three) == (10, 30) and isinstance(two, ValueError) and "row 2" in str(two)


@pytest.mark.parametrize("returned", [[10], [10, 20, 30], "not a list"])
def test_a_batch_with_the_wrong_number_of_results_fails_every_caller(returned):
    from edgespec.cloud.serving.scheduler import BatchSizeMismatch

    async def run(items):
        return returned

    async def main():
        scheduler = BatchScheduler(run, max_batch_size=8, wait_s=0.05, expected=lambda: 2)
        return await asyncio.wait_for(asyncio.gather(*(scheduler.submit(i) for i in (1, 2)), return_exceptions=True), 5)

    results = asyncio.run(main())
    assert all(isinstance(r, BatchSizeMismatch) for r in results), results
