"""``edgespec bench overhead`` end to end, small: it serves its featherweight target through the
real Serve gRPC ingress (in a subprocess, so its Ray is its own), and ends with the figure."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_bench_overhead_prints_the_breakdown_and_ends_with_per_message_cpu(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "edgespec.cli", "bench", "overhead", "--sessions", "4", "--rounds", "5", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=420,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert re.fullmatch(r"per-message CPU \d+ us", lines[-1]), lines[-5:]
    for phase in ("decode", "validation", "scheduling", "bookkeeping", "encode", "ingress", "forward"):
        assert any(line.strip().startswith(phase) for line in lines), phase
