"""Info's step times: batched figures only while batches keep coming, else the lone step's."""

from __future__ import annotations

from edgespec.cloud.serving.steptime import LOADED_FOR_S, StepTime


def test_unknown_until_a_step_ran():
    assert StepTime().value(now=0.0) == 0.0


def test_a_burst_is_reported_while_it_lasts_and_forgotten_after():
    step = StepTime()
    step.add(15.0, 1, now=0.0)
    for t in range(10):
        step.add(60.0, 16, now=1.0 + t * 0.1)
    assert step.value(now=2.0) == 60.0  # under load: what a new session's step costs now
    assert step.value(now=2.0 + LOADED_FOR_S) == 15.0  # the burst ended: the lone step again


def test_lone_steps_average_and_a_new_burst_starts_fresh():
    step = StepTime()
    step.add(10.0, 1, now=0.0)
    step.add(20.0, 1, now=0.1)
    assert abs(step.value(now=0.2) - 11.0) < 1e-9
    step.add(80.0, 8, now=1.0)
    step.add(40.0, 8, now=10.0)  # a burst long after the last one: not averaged with it
    assert step.value(now=10.5) == 40.0


def test_only_batched_steps_known():
    step = StepTime()
    step.add(50.0, 4, now=0.0)
    assert step.value(now=100.0) == 50.0  # better than nothing
