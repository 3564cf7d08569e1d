"""The CPU ledger behind ``bench overhead``: off it records nothing, on it charges thread CPU to phases."""

from __future__ import annotations

from edgespec.cloud.serving.cpu_ledger import CpuLedger


def test_a_disabled_ledger_records_nothing():
    ledger = CpuLedger(False)
    started = ledger.clock()
    ledger.add("decode", started)
    assert started == 0 and not ledger.ns and ledger.snapshot()["phases"] == {}


def test_an_enabled_ledger_charges_cpu_to_phases_and_chains():
    ledger = CpuLedger(True)
    started = ledger.clock()
    sum(i * i for i in range(20_000))  # some CPU work
    now = ledger.add("decode", started)
    ledger.add("encode", now)
    snapshot = ledger.snapshot()
    assert snapshot["phases"]["decode"] > 0 and "encode" in snapshot["phases"]
    assert snapshot["process_ns"] > 0 and snapshot["messages"] == 0
