"""The model backends: batched verification equals one-at-a-time, rollback by cache_len, and
the child-process engine gives the same verdicts and a clear error when it dies."""

from __future__ import annotations

import pytest
import torch

from edgespec.cloud.serving.accept import Row
from edgespec.cloud.serving.backend import BackendError, LocalBackend, ProcessBackend
from edgespec.cloud.serving.config import VerifierConfig
from edgespec.edge.params import Mode, SamplingParams

torch.set_num_threads(1)


def row(key, cache_len, tokens, mode="greedy", round_no=0, q=None):
    sampling = SamplingParams(temperature=0.0 if mode == "greedy" else 0.9, seed=7)
    return Row(key, cache_len, tokens, Mode(mode), sampling, round_no, q)


@pytest.fixture(scope="module")
def config(tiny_pair):
    return VerifierConfig(model=str(tiny_pair.target_dir), device="cpu")


def open_sessions(backend, prompts):
    for key, prompt in enumerate(prompts, 1):
        backend.open(key, prompt[:-1])


PROMPTS = [list(range(5, 25)), list(range(40, 43)), [9], list(range(100, 160))]


def batch_rows(prompts, round_no=0):
    rows = []
    for key, prompt in enumerate(prompts, 1):
        drafts = [(prompt[-1] * 7 + i) % 500 for i in range(1 + key % 3)]
        mode = ("greedy", "token", "exact", "greedy")[key - 1]
        q = [([d, (d + 1) % 500], [0.6, 0.4]) for d in drafts] if mode == "exact" else None
        rows.append(row(key, len(prompt) - 1, [prompt[-1]] + drafts, mode, round_no, q))
    return rows


def test_batch_equals_one_at_a_time(config):
    together, alone = LocalBackend(config), LocalBackend(config)
    open_sessions(together, PROMPTS)
    open_sessions(alone, PROMPTS)
    for round_no in range(3):
        rows = batch_rows(PROMPTS, round_no)
        assert together.verify(rows) == [alone.verify([r])[0] for r in rows]


def test_cache_len_rolls_back_rejected_drafts(config):
    backend, fresh = LocalBackend(config), LocalBackend(config)
    prompt = list(range(5, 25))
    backend.open(1, prompt[:-1])
    backend.verify([row(1, len(prompt) - 1, [prompt[-1], 11, 12, 13])])  # 3 drafts now cached
    # The next round says only the prompt is committed: the drafts must be gone.
    again = backend.verify([row(1, len(prompt) - 1, [prompt[-1], 21, 22])])
    fresh.open(1, prompt[:-1])
    assert again == fresh.verify([row(1, len(prompt) - 1, [prompt[-1], 21, 22])])


def test_unknown_session_is_an_error(config):
    with pytest.raises(BackendError, match="no cache for session 9"):
        LocalBackend(config).verify([row(9, 0, [1])])


@pytest.mark.slow
def test_process_backend_matches_local_and_reports_death(config):
    local, remote = LocalBackend(config), ProcessBackend(config)
    try:
        assert remote.info.tokenizer_fingerprint == local.info.tokenizer_fingerprint
        open_sessions(local, PROMPTS)
        open_sessions(remote, PROMPTS)
        rows = batch_rows(PROMPTS)
        assert remote.verify(rows) == local.verify(rows)
        with pytest.raises(BackendError, match="no cache for session 9"):
            remote.verify([row(9, 0, [1])])
        assert remote.alive  # an error in a request does not kill the engine
        remote.process.kill()
        remote.process.wait(timeout=10)
        with pytest.raises(BackendError, match="not running"):
            remote.verify(rows)
        assert not remote.alive
    finally:
        remote.shutdown()


@pytest.mark.slow  # starts an engine process, which imports torch and transformers
def test_process_backend_reports_a_bad_model(tmp_path):
    (tmp_path / "config.json").write_text("{}")  # a directory that passes the config check only
    with pytest.raises(BackendError, match="loading"):
        ProcessBackend(VerifierConfig(model=str(tmp_path), device="cpu"))


def test_freed_caches_go_back_to_the_os(config, monkeypatch):
    from edgespec.cloud.serving import backend as backend_module

    trims = []
    monkeypatch.setattr(backend_module, "release_free_memory", lambda: trims.append(1))
    backend = LocalBackend(config)
    open_sessions(backend, PROMPTS)
    backend.close(1)
    assert trims == []  # a few KiB freed: not worth a trim
    monkeypatch.setattr(backend_module, "TRIM_AFTER_BYTES", 1)
    backend.close(2)
    assert trims == [1]  # past the threshold
    monkeypatch.setattr(backend_module, "TRIM_AFTER_BYTES", 1 << 40)
    backend.close(3)
    backend.close(99)  # unknown: nothing freed
    assert trims == [1]
    backend.close(4)
    assert trims == [1, 1]  # the last session ended
