"""Shared fixtures: tiny models (built once per session) and a Serve verifier (once per module)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

import pytest

# Before Ray is imported anywhere: no token auth for local tests, no usage stats, quiet.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SERVE_START_TIMEOUT_S = 240


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class ModelPair:
    target_dir: Path
    draft_hf_dir: Path
    draft_dir: Path  # exported ONNX draft


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory) -> ModelPair:
    """A 4-layer random Llama target, its 1-layer cut as draft, and the draft in ONNX."""
    import torch

    from edgespec.cloud.export import export_draft
    from edgespec.cloud.tiny import build_tiny_pair

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("tiny")
    pair = build_tiny_pair(root)
    draft_dir = root / "draft"
    export_draft(pair.draft_dir, draft_dir)
    return ModelPair(pair.target_dir, pair.draft_dir, draft_dir)


@dataclass
class Server:
    address: str
    grpc_port: int
    pair: ModelPair
    metrics_port: int


def start_server(pair: ModelPair, **config_overrides) -> Server:
    from edgespec.cloud.app import init_ray, serve_verifier
    from edgespec.cloud.config import DeploymentOptions, VerifierConfig

    metrics_port = free_port()
    init_ray(num_cpus=4, metrics_export_port=metrics_port)
    port = free_port()
    config = VerifierConfig(model=str(pair.target_dir), device="cpu", **config_overrides)
    serve_verifier(
        config,
        DeploymentOptions(num_cpus=0.5),
        grpc_port=port,
        http_port=free_port(),
        timeout_s=SERVE_START_TIMEOUT_S,
    )
    return Server(f"127.0.0.1:{port}", port, pair, metrics_port)


def stop_server() -> None:
    import ray
    from ray import serve

    try:
        serve.shutdown()
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def server(tiny_pair) -> Server:
    """Ray + Serve + the verifier on the tiny target, started once per test module."""
    # A short batch wait: the tiny target's forward is so quick that, without it, concurrent
    # sessions on 2 loaded cores rarely overlap, and the padded batch path would go untested.
    srv = start_server(tiny_pair, max_sessions=16, max_batch_size=16, batch_wait_timeout_s=0.01)
    yield srv
    stop_server()


@pytest.fixture(scope="session")
def target_model(tiny_pair):
    """The tiny target in transformers, for reference outputs (generate())."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(tiny_pair.target_dir).eval()


def reference_greedy(model, prompt_ids: list[int], max_new_tokens: int, eos: int | None = None) -> list[int]:
    import torch

    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt_ids]),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=0,
        )
    return out[0, len(prompt_ids) :].tolist()


PROMPTS = [
    "def main(argv=None):\n    parser = ",
    "import os\nimport sys\n\n",
    "class Formatter:\n    def __init__(self",
    "    return self.",
    "x = [",
    "for i in range(",
    "if __name__ == '__main__':\n",
    "    def format_help(self):\n        ",
    "from typing import",
    "# Copyright",
    "        raise ValueError(",
    "while True:\n    ",
    "try:\n    import",
    "def _get_args(self):\n",
    "    @property\n    def",
    "result = {}\nfor key, value in",
    "lines = text.splitlines()\n",
    "        self._width = ",
    "print(",
    "_sentinel = object()\n",
    "JSON = ",
    "    except KeyError:\n        ",
]
