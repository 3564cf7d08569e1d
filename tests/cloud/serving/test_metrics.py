"""Replica metrics: one batch's counters, summed per batch and tagged as documented."""

from __future__ import annotations

from collections import defaultdict

import grpc

from edgespec.cloud.serving import metrics as metrics_module
from edgespec.cloud.serving.metrics import VerifierMetrics
from edgespec.cloud.serving.session import DraftBlock, Verdict
from edgespec.cloud.serving.verifier import VerifyItem
from edgespec.edge.params import Finish, Mode


class Recorder:
    """Stands in for ray.serve.metrics: every instrument appends what it is given."""

    log = defaultdict(list)

    def __init__(self, name, description="", tag_keys=(), boundaries=None):
        self.name = name

    def inc(self, value=1.0, tags=None):
        Recorder.log[self.name].append((value, dict(tags or {})))

    def observe(self, value, tags=None):
        Recorder.log[self.name].append((value, dict(tags or {})))

    def set(self, value, tags=None):
        Recorder.log[self.name].append((value, dict(tags or {})))


class FakeState:
    def __init__(self, mode):
        self.spec = type("Spec", (), {"mode": mode})()
        self.mode = mode  # SessionState.mode: the spec's, checked at open


def test_a_batch_is_counted_per_mode_position_and_path(monkeypatch):
    for kind in ("Counter", "Histogram", "Gauge"):
        monkeypatch.setattr(metrics_module.metrics, kind, Recorder)
    Recorder.log.clear()
    recorder = VerifierMetrics()
    items = [
        VerifyItem(FakeState(Mode.GREEDY), DraftBlock(0, [1, 2, 3])),
        VerifyItem(FakeState(Mode.EXACT), DraftBlock(0, [4, 5])),
        VerifyItem(FakeState(Mode.GREEDY), None),  # a Generate step
    ]
    verdicts = [Verdict(0, 2, 9, Finish.NONE, 3, 4.5), Verdict(0, 0, 7, Finish.NONE, 3, 4.5), Verdict(0, 0, 8, Finish.NONE, 3, 4.5)]
    recorder.record_batch(items, verdicts)
    log = Recorder.log
    assert log["edgespec_verify_batch_size"] == [(3, {})] and log["edgespec_verify_seconds"] == [(0.0045, {})]
    assert sorted(log["edgespec_drafted_tokens_total"], key=str) == [(2, {"mode": "exact"}), (3, {"mode": "greedy"})]
    assert log["edgespec_accepted_tokens_total"] == [(2, {"mode": "greedy"})]  # exact accepted none: no zero increment
    drafted_at = {tags["position"]: value for value, tags in log["edgespec_position_drafted_total"]}
    accepted_at = {tags["position"]: value for value, tags in log["edgespec_position_accepted_total"]}
    assert drafted_at == {"1": 2, "2": 2, "3": 1} and accepted_at == {"1": 1, "2": 1}
    assert sorted(v for v, _ in log["edgespec_acceptance_length"]) == [1, 3]
    generated = {tags["path"]: value for value, tags in log["edgespec_generated_tokens_total"]}
    assert generated == {"speculative": 4, "cloud_only": 1}
    recorder.error(grpc.StatusCode.INVALID_ARGUMENT)
    assert log["edgespec_errors_total"] == [(1.0, {"code": "INVALID_ARGUMENT", "key": ""})]
    recorder.error(grpc.StatusCode.RESOURCE_EXHAUSTED, "k_3f2a")
    assert log["edgespec_errors_total"][-1] == (1.0, {"code": "RESOURCE_EXHAUSTED", "key": "k_3f2a"})


def test_the_metrics_list_is_what_verifier_metrics_registers(monkeypatch):
    registered = set()
    for kind in ("Counter", "Histogram", "Gauge"):
        def instrument(name, *args, _kind=kind.lower(), **kwargs):
            registered.add((name, _kind))
            return Recorder(name)

        monkeypatch.setattr(metrics_module.metrics, kind, instrument)
    VerifierMetrics()
    assert registered == set(metrics_module.METRICS)
    for name, kind in metrics_module.METRICS:  # Prometheus conventions: counters end in _total, times in _seconds
        assert name.endswith("_total") == (kind == "counter"), name
        assert not name.endswith("_ms"), name
