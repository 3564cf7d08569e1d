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


# ---- waiting only for the sessions on their way back (gather_wait, ReturnTimes) ----------------

from edgespec.cloud.serving.scheduler import RETURN_WEIGHT, ReturnTimes, gather_wait  # noqa: E402


@pytest.mark.parametrize("arrivals, waits", [
    ([], False),  # nobody else open: a lone session never waits
    ([12.0], True),  # expected 2 s before the deadline
    ([14.0, 30.0], True),  # one of them is enough
    ([14.0001], False),  # just after the deadline: joins the next forward instead
    ([30.0, 99.0], False),
    ([None], True),  # not known (a Generate stream, a session yet to send): expected now
    ([5.0], True),  # late: still expected, until the deadline
])
def test_the_gather_waits_only_while_someone_is_expected_by_the_deadline(arrivals, waits):
    assert gather_wait(10.0, 14.0, arrivals) == (4.0 if waits else 0.0)


def test_no_wait_is_left_at_the_deadline():
    assert gather_wait(14.0, 14.0, [None]) == 0.0
    assert gather_wait(15.0, 14.0, [12.0]) == 0.0


def test_a_sessions_next_arrival_is_its_last_result_plus_its_decayed_return_interval():
    returns = ReturnTimes()
    returns.arrived("a", 0.0)
    assert returns.expected("a") is None  # in: not away
    returns.left("a", 1.0)
    assert returns.expected("a") is None  # away, but no interval measured yet
    returns.arrived("a", 1.5)  # 0.5
    returns.left("a", 2.0)
    assert returns.expected("a") == pytest.approx(2.5)
    returns.arrived("a", 3.5)  # 1.5: the mean moves a quarter of the way
    returns.left("a", 4.0)
    assert returns.expected("a") == pytest.approx(4.0 + 0.5 + RETURN_WEIGHT * (1.5 - 0.5))


def test_a_forgotten_session_is_not_brought_back_by_a_late_result():
    returns = ReturnTimes()
    returns.arrived("a", 0.0)
    returns.forget("a")
    returns.left("a", 1.0)  # its forward ended after its caller went away
    assert returns.away(0, []) == []


def test_the_open_sessions_away_are_the_tracked_ones_not_in_and_the_untracked_rest():
    returns = ReturnTimes()
    for session in ("a", "b"):
        returns.arrived(session, 0.0)
        returns.left(session, 1.0)
        returns.arrived(session, 1.2)
        returns.left(session, 2.0)
    returns.arrived("b", 2.3)  # b is in
    # 5 open: a (away), b (in), one untracked in (a Generate step), two untracked away
    assert returns.away(5, ["b", None]) == [pytest.approx(2.2), None, None]


class Clock:
    """A scripted clock: the scheduler's time moves only when the test moves it."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def scripted(open_sessions: int, *, returning: bool = True, wait_s: float = 10.0):
    """A scheduler whose items are (session, round), session None for a Generate step; the
    wait is 10 s of the clock and of the event loop, so a test that passes never waits it out
    (``forward``: set each time a forward starts)."""
    clock, batches, forward = Clock(), [], asyncio.Event()

    async def run(items):
        batches.append([session for session, _ in items])
        forward.set()
        return [None] * len(items)

    scheduler = BatchScheduler(run, max_batch_size=8, wait_s=wait_s, expected=lambda: open_sessions,
                               session=(lambda item: item[0]) if returning else None, clock=clock)
    return scheduler, clock, batches, forward


async def both_back_at(scheduler, clock, t: float, rounds: tuple[int, int]) -> None:
    """Sessions a and b come back at clock time t, together, into one forward."""
    clock.t = t
    await asyncio.gather(scheduler.submit(("a", rounds[0])), scheduler.submit(("b", rounds[1])))


def test_a_session_not_expected_within_the_wait_does_not_hold_the_forward():
    async def main():
        scheduler, clock, batches, forward = scripted(2)
        await both_back_at(scheduler, clock, 0.0, (0, 0))  # both unknown: waited for
        # a comes back 0.01 s after its verdict, b 100 s after: both measured once.
        clock.t = 0.01
        a = asyncio.ensure_future(scheduler.submit(("a", 1)))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        clock.t = 100.0
        await asyncio.gather(a, scheduler.submit(("b", 1)))  # (b not measured yet: a waited for it)
        # Now a is back 0.01 s after its verdict and b is expected 100 s after: a goes alone.
        forward.clear()
        clock.t = 100.01
        a = asyncio.ensure_future(scheduler.submit(("a", 2)))
        await asyncio.wait_for(forward.wait(), 5.0)
        await a
        return batches, scheduler.stats

    batches, stats = asyncio.run(main())
    assert batches == [["a", "b"], ["a", "b"], ["a"]]
    assert stats.gathers == 3 and stats.full_waits == 0
    # the second gather waited from a's return (0.01) to b's (100); the others not at all
    assert stats.waited_s == pytest.approx(100.0 - 0.01)
    assert stats.forward_s == 0.0  # the clock did not move during a forward


def test_the_old_rule_waits_for_every_open_session():
    async def main():
        scheduler, clock, batches, _ = scripted(2, returning=False)
        await both_back_at(scheduler, clock, 0.0, (0, 0))
        await both_back_at(scheduler, clock, 100.0, (1, 1))
        clock.t = 100.01
        a = asyncio.ensure_future(scheduler.submit(("a", 2)))
        for _ in range(3):
            await asyncio.sleep(0)
        clock.t = 200.0
        await asyncio.gather(a, scheduler.submit(("b", 2)))
        return batches, scheduler.stats

    batches, stats = asyncio.run(main())
    assert batches == [["a", "b"]] * 3
    assert stats.waited_s == pytest.approx(200.0 - 100.01)


def test_a_generate_stream_is_always_waited_for():
    async def main():
        scheduler, clock, batches, _ = scripted(2)  # a speculative session and a Generate stream
        for t, round_no in ((0.0, 0), (100.0, 1)):  # a: away 100 s, measured once
            clock.t = t
            await asyncio.gather(scheduler.submit(("a", round_no)), scheduler.submit((None, round_no)))
        # a is not expected for 100 s; the stream's next step follows at once, and is waited for.
        clock.t = 200.0
        a = asyncio.ensure_future(scheduler.submit(("a", 2)))
        for _ in range(3):
            await asyncio.sleep(0)
        gathering = len(batches) == 2
        await asyncio.gather(a, scheduler.submit((None, 2)))
        return batches, gathering

    batches, gathering = asyncio.run(main())
    assert gathering and batches[2] == ["a", None]


def test_the_verifiers_knob_names_the_rule():
    from helpers import REPO

    from edgespec.cloud.serving.config import VerifierConfig

    target = str(REPO / "models" / "demo" / "target")
    assert VerifierConfig(model=target).batch_wait_for == "returning"
    assert VerifierConfig.from_dict({"model": target, "batch_wait_for": "all"}).batch_wait_for == "all"
    with pytest.raises(ValueError, match="batch_wait_for must be one of"):
        VerifierConfig(model=target, batch_wait_for="some")


def test_the_stats_count_each_gathers_wait_and_forward():
    clock = Clock()

    async def run(items):
        clock.t += 0.02  # the forward takes 20 ms of the scripted clock
        return list(items)

    async def main():
        scheduler = BatchScheduler(run, max_batch_size=8, wait_s=10.0, expected=lambda: 1, clock=clock)
        for item in range(3):
            await scheduler.submit(item)
        return scheduler.stats

    stats = asyncio.run(main())
    assert (stats.gathers, stats.full_waits, stats.mean_wait_ms) == (3, 0, 0.0)  # a lone session never waits
    assert stats.mean_forward_ms == pytest.approx(20.0)
