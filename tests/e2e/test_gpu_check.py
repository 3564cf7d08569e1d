"""scripts/gpu_check.sh without a GPU: --help and --plan work, a run refuses in one line, options
parse, a backend that cannot run is never a silent pass; slow: the whole check on the CPU, both
backends, the demo target at tiny sizes (the script's own logic, not the GPU's numbers)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.sh"


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)


def test_help_runs_anywhere():
    result = run("--help")
    assert result.returncode == 0
    assert "greedy" in result.stdout and "1, 16 and 64" in result.stdout and "--backends transformers,vllm" in result.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_it_refuses_in_one_line():
    result = run()
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0]
    assert result.stdout == ""


def test_the_plan_lists_both_backends_and_needs_no_gpu():
    result = run("--plan")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "backends transformers, vllm" in out and "per backend (transformers, vllm)" in out
    assert "tokens/s at 1,16,64 sessions: speculative" in out and "cloud-only" in out and "idle" in out
    if torch.cuda.device_count() < 2:
        assert "vllm TP 2: skipped:" in out


def test_the_python_side_refuses_too_and_parses_its_options():
    from edgespec.cloud.bench.gpu_check import NO_CUDA, near_tie, parse_args

    args = parse_args(["--sessions", "1,2", "--skip-random"])
    assert args.sessions == "1,2" and args.skip_random and "no CUDA device" in NO_CUDA
    assert args.backends == ("transformers", "vllm") and args.tensor_parallel_size == 2
    logits = torch.tensor([10.0, 10.01, 3.0])
    assert near_tie(logits, 0, 1) and not near_tie(logits, 0, 2)


def test_backends_parse_as_a_subset_in_order():
    from edgespec.cloud.bench.gpu_check import parse_args, parse_backends

    assert parse_backends("vllm") == ("vllm",)
    assert parse_backends(" vllm , transformers,vllm") == ("vllm", "transformers")
    for bad in ("", "vllm,sglang", ","):
        with pytest.raises(argparse.ArgumentTypeError, match="subset of transformers,vllm"):
            parse_backends(bad)
    with pytest.raises(SystemExit):
        parse_args(["--backends", "tensorrt"])


def test_without_vllm_the_run_says_so_and_does_not_pass(monkeypatch, capsys):
    from edgespec.cloud.bench import gpu_check

    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    args = gpu_check.parse_args(["--plan"])
    lines = gpu_check.plan(args, gpus=1, vllm_error=gpu_check.vllm_import_error())
    assert "vllm: SKIPPED: import vllm failed (ModuleNotFoundError" in lines[1]
    assert "per backend (transformers)" in "\n".join(lines) and "TP" not in "\n".join(lines)
    assert gpu_check.main(["--device", "cpu", "--backends", "vllm", "--skip-random"]) == gpu_check.SKIPPED
    assert "INCOMPLETE" in capsys.readouterr().out


def test_tp_runs_only_where_there_are_enough_gpus():
    from edgespec.cloud.bench import gpu_check

    args = gpu_check.parse_args([])
    assert any("3. vllm TP 2 on the largest target" in line for line in gpu_check.plan(args, gpus=2, vllm_error=None))
    assert any("vllm TP 2: skipped: 1 GPU(s) visible" in line for line in gpu_check.plan(args, gpus=1, vllm_error=None))
    args = gpu_check.parse_args(["--tensor-parallel-size", "1"])
    assert not any("TP" in line for line in gpu_check.plan(args, gpus=2, vllm_error=None))


@pytest.mark.slow
def test_the_whole_check_runs_on_the_cpu():
    """Both backends serve the demo target on the CPU (float32) through Serve: every step runs and
    prints its figures, and the run passes (1.5-3.5 min on 2 shared cores, most of it the engines starting)."""
    pytest.importorskip("vllm")
    command = [sys.executable, "-m", "edgespec.cloud.bench.gpu_check", "--device", "cpu", "--skip-random", "--sessions", "1,4",
               "--rounds", "3", "--prompts", "2", "--max-new-tokens", "10", "--generate-tokens", "10", "--idle-sessions", "4",
               "--idle-tokens", "64"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=SCRIPT.parents[1])
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    for backend in ("transformers", "vllm"):
        assert f"{backend}/demo: speculative == cloud-only (same replica) OK" in out
        assert f"{backend}/demo: speculative == generate() OK" in out
        assert f"{backend}/demo:   4 sessions  speculative: verified" in out and "cloud-only:" in out
    assert "transformers/demo: 4 idle sessions (prompt 64, max_new_tokens 64): KV reserved" in out
    assert "MiB a session, pinned until Close" in out
    # idle sessions pin no vLLM block; the gauge is live (one decoding stream moves it)
    assert "vllm/demo: 4 idle sessions (prompt 64, max_new_tokens 64): vLLM KV blocks in use 0 of" in out
    assert "while one stream decodes: 0)" not in out and "0.00 MiB pinned a session" in out
    assert "vllm TP 2: skipped: 0 GPU(s) visible" in out and "gpu_check: passed" in out
