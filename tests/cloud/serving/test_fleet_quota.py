"""The fleet-wide token count through a real detached Ray actor: two replicas' views share it.
One local Ray instance, no Serve: ~15 s here."""

from __future__ import annotations

import time

import pytest

from edgespec.cloud.serving.fleet_quota import ACTOR_NAME, NAMESPACE, FleetQuota, store_actor

pytestmark = pytest.mark.slow


def reaches(view: FleetQuota, key_id: str, expected: int, timeout_s: float = 30.0) -> bool:
    """Whether ``used`` reaches ``expected`` (the replica never waits for the store; the test polls)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if view.used(key_id) == expected:
            return True
        time.sleep(0.05)
    return False


def test_two_views_share_one_detached_store():
    import ray

    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="WARNING")
    try:
        first, second = FleetQuota(flush_s=0.1), FleetQuota(flush_s=0.1)
        first.charge("fleet-a", 70)
        assert first.used("fleet-a") == 70  # its own charge counts at once
        assert reaches(second, "fleet-a", 70)  # the other replica's view, through the store
        second.charge("fleet-a", 50)
        second.charge("fleet-b", 5)
        assert second.used("fleet-b") == 5
        time.sleep(0.2)
        second.used("fleet-a")  # charges go out at a replica's next check (before each round), once per flush_s
        assert not second._pending
        assert reaches(first, "fleet-a", 120) and reaches(first, "fleet-b", 0) and reaches(second, "fleet-a", 120)
        assert ray.get_actor(ACTOR_NAME, namespace=NAMESPACE) is not None  # named, detached: outlives its creator
        assert store_actor()._actor_id == ray.get_actor(ACTOR_NAME, namespace=NAMESPACE)._actor_id  # one per cluster
    finally:
        try:
            ray.kill(ray.get_actor(ACTOR_NAME, namespace=NAMESPACE))
        finally:
            ray.shutdown()
