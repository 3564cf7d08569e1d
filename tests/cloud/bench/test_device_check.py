"""scripts/device_check.py: the engine-only GPU check run small on the CPU, how it imports this
checkout where edgespec is not installed, and how it tells a bf16 tie from a mismatch."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from helpers import REPO

SCRIPT = REPO / "scripts" / "device_check.py"
# What the GPU machines lack (they have torch and transformers): importing any of it fails the run.
ABSENT = ["grpc", "ray", "vllm", "google.protobuf", "onnx", "onnxruntime"]
WITHOUT = ("import runpy, sys; sys.modules.update(dict.fromkeys(sys.argv[1].split(','))); "
           "sys.argv = sys.argv[2:]; runpy.run_path(sys.argv[0], run_name='__main__')")
SMALL = ["--device", "cpu", "--layers", "2", "--hidden", "64", "--prompts", "2", "--max-new-tokens", "12",
         "--rows", "1,4", "--context", "32", "--steps", "2"]


@pytest.mark.slow  # loads the demo target, builds a random one
def test_a_small_run_on_the_cpu_without_grpc_ray_or_onnx_prints_every_figure_and_passes():
    result = subprocess.run([sys.executable, "-c", WITHOUT, ",".join(ABSENT), str(SCRIPT), *SMALL], capture_output=True,
                            text=True, timeout=300, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for name in ("demo", "random-llama"):
        assert re.search(rf"^{name}: .* batch path paged", out, re.M), out
        assert f"{name}: greedy == generate() OK: 2 sessions x 12 tokens" in out
        for rows in (1, 4):
            assert re.search(rf"^{name}: packed step +{rows} rows +median +[\d.]+ ms .* verified tokens/s", out, re.M), out
        per_token = re.search(rf"^{name}: KV (\d+) B/token \(config\), (\d+) B/token \(pool\)", out, re.M)
        assert per_token and per_token[1] == per_token[2] and int(per_token[1]) > 0, out
        assert re.search(rf"^{name}: KV per session at 2048 tokens: [\d.]+ MiB", out, re.M), out
    assert re.search(r"^device_check: passed in \d+s$", out, re.M), out


def _imported_config(script) -> str:
    """Where the serving config (light: no torch) comes from once ``script`` made edgespec importable."""
    code = ("import runpy, sys; print(runpy.run_path(sys.argv[1])['import_this_checkout']()); "
            "import edgespec.cloud.serving.config as c, edgespec.v1.speculative_pb2; print(c.__file__)")
    result = subprocess.run([sys.executable, "-c", code, str(script)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_it_imports_this_checkout_through_src_or_without_its_links(tmp_path):
    assert f"{REPO / 'src' / 'edgespec' / 'cloud' / 'serving' / 'config.py'}" in _imported_config(SCRIPT)
    copy = tmp_path / "copy"  # a tree whose src/ links did not survive the copy
    (copy / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, copy / "scripts")
    for name in ("edge", "cloud", "proto"):
        (copy / name).symlink_to(REPO / name, target_is_directory=True)
    out = _imported_config(copy / "scripts" / "device_check.py")
    assert "lost its links" in out and f"{copy / 'cloud' / 'serving' / 'config.py'}" in out


class _Model:
    """generate()'s model as ``compare`` reads it: logits for the last position."""

    def __init__(self, last: list[float]):
        self.last = torch.tensor([last])

    def __call__(self, input_ids):
        return SimpleNamespace(logits=self.last[None].expand(1, input_ids.shape[1], -1))


def test_a_bf16_tie_is_printed_as_one_and_any_other_divergence_fails(capsys):
    from edgespec.cloud.bench.device_check import compare

    prompts, refs = [[5, 6]], [[0, 2, 1]]
    assert compare("t", _Model([3.0, 10.0, 10.01]), prompts, refs, [[0, 2, 1]], "cpu") == (0, 0)
    assert compare("t", _Model([3.0, 10.0, 10.01]), prompts, refs, [[0, 1, 0]], "cpu") == (0, 1)
    assert compare("t", _Model([3.0, 9.0, 10.01]), prompts, refs, [[0, 1, 0]], "cpu") == (1, 0)
    out = capsys.readouterr().out
    assert "tie t: token 1: generate() 2, engine 1" in out and "MISMATCH t: token 1: generate() 2, engine 1" in out
