"""scripts/gpu_check.sh on a machine without a GPU: --help works, a run refuses in one line."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.sh"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_help_runs_anywhere():
    result = run("--help")
    assert result.returncode == 0
    assert "greedy == generate()" in result.stdout and "1, 16 and 64" in result.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_it_refuses_in_one_line():
    result = run()
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0]
    assert result.stdout == ""


def test_the_python_side_refuses_too_and_parses_its_options():
    from edgespec.cloud.bench.gpu_check import NO_CUDA, near_tie, parse_args

    args = parse_args(["--sessions", "1,2", "--skip-random"])
    assert args.sessions == "1,2" and args.skip_random and "no CUDA device" in NO_CUDA
    logits = torch.tensor([10.0, 10.01, 3.0])
    assert near_tie(logits, 0, 1) and not near_tie(logits, 0, 2)
