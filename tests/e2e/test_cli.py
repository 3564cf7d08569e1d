"""The command line, and the edge SDK installed alone (no torch, Ray or transformers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import PROMPTS, REPO, reference_greedy

pytestmark = pytest.mark.slow

EDGESPEC = Path(sys.executable).parent / "edgespec"
FORBIDDEN = ("torch", "ray", "transformers")


def run(cmd: list[str], timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)


def test_generate_cli_json_matches_target(server, target_model):
    proc = run(
        [str(EDGESPEC), "generate", "--server", server.address, "--draft", str(server.pair.draft_dir),
         "--prompt", PROMPTS[0], "--max-new-tokens", "16", "--k", "3", "--json"]
    )
    assert proc.returncode == 0, proc.stderr
    payload = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(payload) >= {"text", "token_ids", "stats"}
    from edgespec.edge.tokenizer import load_tokenizer

    prompt_ids = load_tokenizer(server.pair.draft_dir).encode(PROMPTS[0]).ids
    expected = reference_greedy(target_model, prompt_ids, 16, eos=0)
    assert payload["token_ids"] == expected
    stats = payload["stats"]
    assert stats["rounds"] >= 1  # speculative, not cloud-only
    # every round commits its accepted drafts plus one token: tau is tokens per round
    assert stats["mean_acceptance_length"] == pytest.approx(len(expected) / stats["rounds"])


def test_generate_cli_streams_text_and_stats(server):
    """A fixed k speculates from the first token (k=auto may stream cloud-only at first: its
    choice, tested with a scripted link in test_links_features), so the rounds' stats print."""
    proc = run(
        [str(EDGESPEC), "generate", "--server", server.address, "--draft", str(server.pair.draft_dir),
         "--prompt", PROMPTS[1], "--max-new-tokens", "12", "--k", "4"]
    )
    assert proc.returncode == 0, proc.stderr
    assert "mean acceptance length" in proc.stderr and "ms/token" in proc.stderr


def test_generate_cli_reports_a_bad_server_clearly(server):
    proc = run(
        [str(EDGESPEC), "generate", "--server", "127.0.0.1:1", "--draft", str(server.pair.draft_dir),
         "--prompt", "x", "--timeout", "2"],
        timeout=120,
    )
    assert proc.returncode == 1
    assert "unavailable" in proc.stderr.lower()


def test_serve_cli_refuses_a_bad_model_dir(tmp_path):
    proc = run([str(EDGESPEC), "serve", "--model", str(tmp_path)], timeout=120)
    assert proc.returncode == 2
    assert "no config.json" in proc.stderr


@pytest.fixture(scope="module")
def edge_venv(tmp_path_factory) -> Path:
    """A fresh virtualenv with only `pip install edgespec[edge]`."""
    venv = tmp_path_factory.mktemp("edge-only") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    proc = run([str(venv / "bin" / "pip"), "install", "--quiet", f"{REPO}[edge]"], timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return venv


def test_edge_only_install_generates_without_torch_ray_transformers(edge_venv, server, target_model, tmp_path):
    script = textwrap.dedent(
        f"""
        import json, sys
        from edgespec.edge.client import EdgeClient
        with EdgeClient({server.address!r}, {str(server.pair.draft_dir)!r}) as client:
            result = client.generate({PROMPTS[0]!r}, max_new_tokens=16, k="auto", stop_token_ids=())
            ids = client.encode({PROMPTS[0]!r})
        loaded = sorted({{m.split('.')[0] for m in sys.modules}} & set({FORBIDDEN!r}))
        print(json.dumps({{"token_ids": result.token_ids, "prompt_ids": ids, "loaded": loaded}}))
        """
    )
    proc = run([str(edge_venv / "bin" / "python"), "-c", script], cwd=tmp_path, env={**os.environ, "PYTHONPATH": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    payload = json.loads(proc.stdout.strip().splitlines()[-1])
    assert payload["loaded"] == []
    assert payload["token_ids"] == reference_greedy(target_model, payload["prompt_ids"], 16)
    for package in FORBIDDEN:
        probe = run([str(edge_venv / "bin" / "python"), "-c", f"import {package}"], cwd=tmp_path)
        assert probe.returncode != 0, f"{package} is installed in the edge-only environment"
    # From the source checkout's root too: no folder there shadows the installed package.
    probe = run([str(edge_venv / "bin" / "python"), "-c", "import edgespec.edge.client, edgespec.cli"], cwd=REPO)
    assert probe.returncode == 0, probe.stderr[-2000:]


def test_edge_only_cli_explains_missing_cloud_extra(edge_venv, tmp_path):
    proc = run([str(edge_venv / "bin" / "edgespec"), "serve", "--model", "x"], cwd=tmp_path)
    assert proc.returncode == 2
    assert "edgespec[cloud]" in proc.stderr
