"""Shared fixtures: tiny models (built once per session) and a Serve verifier (started once for the modules that share it)."""

from __future__ import annotations

import os

import pytest

# Before Ray is imported anywhere: no token auth for local tests, no usage stats, quiet.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Serve's gRPC ingress for every test module that starts Serve: the product's default unless
# EDGESPEC_TEST_INGRESS says otherwise (its flags are read when Ray is imported, so: now).
# Replicas drain for 1 s, not 30 s, when a module stops Serve.
from edgespec.cloud.serving.ingress import DEFAULT_INGRESS, ingress_flags  # noqa: E402

for _name, _value in ingress_flags(os.environ.get("EDGESPEC_TEST_INGRESS", DEFAULT_INGRESS)).items():
    os.environ.setdefault(_name, _value)
os.environ.setdefault("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "1")


from helpers import ModelPair, Server, start_server, stop_server  # noqa: E402

# A test that needs any of these (directly or through another fixture) loads or exports a
# model or starts Serve: it is slow, and `make test-fast` (-m "not slow") leaves it out.
MODEL_FIXTURES = {"tiny_pair", "server", "target_model"}


SLOW_MODULE_LINE = "pytestmark = pytest.mark.slow"


def pytest_ignore_collect(collection_path, config):
    """With slow tests deselected, a test module marked slow as a whole is not even imported."""
    if config.getoption("markexpr", "") != "not slow" or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_"):
        return None
    head = collection_path.read_text(encoding="utf-8", errors="replace")
    return True if any(line.startswith(SLOW_MODULE_LINE) for line in head.splitlines()) else None


# The modules that take longest (a minute or more each on 2 cores, mostly waiting on Serve, a
# fake cluster or a sampling sweep), started first: `make test TEST_WORKERS=2` runs modules on
# two pytest-xdist workers in this order (--no-loadscope-reorder), and the short ones then fill
# in behind them. Only the wall time depends on this list; any order is correct.
LONGEST_FIRST = (
    "e2e/test_vllm_serve.py",
    "e2e/test_sampling_fit.py",
    "cloud/serving/test_vllm_backend.py",
    "e2e/test_cluster.py",
    "e2e/test_real_target.py",
    "e2e/test_restart.py",
    "cloud/training/test_export_families.py",
    "e2e/test_hostile.py",
    "e2e/test_websocket.py",
    "e2e/test_scale_override.py",
    "e2e/test_bad_input.py",
    "e2e/test_bench_overhead.py",
)


def pytest_collection_modifyitems(items):
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    # The modules that use the shared verifier (the session-scoped ``server`` below) run last and
    # together, so Ray and Serve start once for all of them (once per xdist worker): a module
    # that starts a server of its own (a module-level ``server`` or ``start_server``) must not
    # run while it is up. Each xdist worker takes whole modules in this order, so this holds in
    # each worker as well.
    shared = {item.module.__name__ for item in items if _uses_shared_server(item)}
    items.sort(key=lambda item: (item.module.__name__ in shared, _longest_first_rank(item)))  # stable


def _longest_first_rank(item) -> int:
    path = item.path.as_posix()
    return next((rank for rank, suffix in enumerate(LONGEST_FIRST) if path.endswith("/tests/" + suffix)),
                len(LONGEST_FIRST))


def _uses_shared_server(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    definitions = info.name2fixturedefs.get("server") if info is not None else None
    return bool(definitions) and definitions[-1].scope == "session"


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory) -> ModelPair:
    """A 4-layer random Llama target, its 1-layer cut as draft, and the draft in ONNX."""
    import torch

    from edgespec.cloud.training.export import export_draft
    from edgespec.cloud.training.tiny import build_tiny_pair

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("tiny")
    pair = build_tiny_pair(root)
    draft_dir = root / "draft"
    export_draft(pair.draft_dir, draft_dir)
    return ModelPair(pair.target_dir, pair.draft_dir, draft_dir)


@pytest.fixture(scope="session")
def server(tiny_pair) -> Server:
    """Ray + Serve + the verifier on the tiny target, started once for every module that uses
    it (they run last, together: ``pytest_collection_modifyitems``). A module that needs other
    settings starts its own server with ``start_server`` and stops it when it ends."""
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


