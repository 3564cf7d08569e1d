"""Verification of a batch, free of any model: rows built from sessions, limits applied to
the raw verdicts, caches opened and freed (the backend is a scripted stand-in)."""

from __future__ import annotations

import pytest

from edgespec.cloud.serving.accept import Outcome
from edgespec.cloud.serving.backend import BackendInfo
from edgespec.cloud.serving.config import VerifierConfig
from edgespec.cloud.serving.session import DraftBlock, OpenRequest
from edgespec.cloud.serving.verifier import Verifier, VerifyItem
from edgespec.edge.params import Finish, Mode, SamplingParams


class ScriptedBackend:
    """Records what the verifier asks for; answers verify() with the next scripted results."""

    def __init__(self, results: list[list[tuple[int, int]]]):
        self.info = BackendInfo(vocab_size=100, max_context=64, tokenizer_fingerprint="tok1-test-100-fp", params=1, kv_bytes_per_token=8, description={})
        self.results = list(results)
        self.opened: dict[int, list[int]] = {}
        self.closed: list[int] = []
        self.batches = []

    def open(self, key, prefix):
        self.opened[key] = list(prefix)

    def extend(self, key, tokens):
        self.opened[key] += tokens

    def close(self, key):
        self.closed.append(key)

    def verify(self, rows):
        self.batches.append(rows)
        return [Outcome(*result) for result in self.results.pop(0)]

    def shutdown(self):
        pass


@pytest.fixture
def config(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    return VerifierConfig(model=str(tmp_path), max_k=4, max_new_tokens=30, default_max_new_tokens=10)


def request(prompt, mode=Mode.GREEDY, temperature=0.0, max_new_tokens=0, stop=(), first_round=0):
    return OpenRequest(prompt_ids=list(prompt), sampling=SamplingParams(temperature=temperature, seed=5), mode=mode,
                       mode_number=1, tokenizer_fingerprint="tok1-test-100-fp", max_new_tokens=max_new_tokens,
                       stop_token_ids=list(stop), first_round=first_round)


def test_start_prefills_all_but_the_pending_token_and_keys_are_unique(config):
    backend = ScriptedBackend([])
    verifier = Verifier(config, backend)
    a = verifier.start(request([1, 2, 3]))
    b = verifier.start(request([7]))
    assert backend.opened == {a.cache_key: [1, 2], b.cache_key: []} and a.cache_key != b.cache_key
    assert verifier.limits.max_context == 64 and verifier.limits.max_k == 4


def test_a_batch_becomes_rows_and_verdicts_in_order(config):
    backend = ScriptedBackend([[(2, 50), (0, 60)]])
    verifier = Verifier(config, backend)
    greedy = verifier.start(request([1, 2, 3]))
    sampled = verifier.start(request([4, 5], mode=Mode.EXACT, temperature=0.8, first_round=7))
    q = [([9], [1.0])]
    verdicts = verifier.step([
        VerifyItem(greedy, DraftBlock(0, [10, 11, 12])),
        VerifyItem(sampled, DraftBlock(7, [9], q)),
    ])
    (rows,) = backend.batches
    assert rows[0].tokens == [3, 10, 11, 12] and rows[0].cache_len == 2 and rows[0].mode is Mode.GREEDY
    assert rows[1].tokens == [5, 9] and rows[1].round_no == 7 and rows[1].q == q and rows[1].sampling.temperature == 0.8
    assert [(v.round_no, v.accepted, v.next_token, v.batch_size) for v in verdicts] == [(0, 2, 50, 2), (7, 0, 60, 2)]
    assert greedy.committed == [1, 2, 3, 10, 11, 50] and sampled.committed == [4, 5, 60]
    assert greedy.last_verdict is verdicts[0] and sampled.next_round == 8


def test_limits_are_applied_to_the_raw_verdict(config):
    backend = ScriptedBackend([[(3, 99)]])
    verifier = Verifier(config, backend)
    state = verifier.start(request([1], max_new_tokens=2))
    (verdict,) = verifier.step([VerifyItem(state, DraftBlock(0, [10, 11, 12]))])
    assert (verdict.accepted, verdict.next_token, verdict.finish) == (1, 11, Finish.LENGTH)
    assert state.finished and state.generated == 2


def test_a_decoding_step_has_no_drafts(config):
    backend = ScriptedBackend([[(0, 42)]])
    verifier = Verifier(config, backend)
    state = verifier.start(request([1, 2]), generate=True)
    (verdict,) = verifier.step([VerifyItem(state, None)])
    assert backend.batches[0][0].tokens == [2] and verdict.next_token == 42 and state.committed == [1, 2, 42]


def test_finish_frees_the_cache_once(config):
    backend = ScriptedBackend([])
    verifier = Verifier(config, backend)
    state = verifier.start(request([1, 2]))
    key = state.cache_key
    verifier.finish(state)
    verifier.finish(state)
    assert backend.closed == [key] and state.cache_key is None


def test_a_tree_commits_its_accepted_path(config):
    backend = ScriptedBackend([[(2, 77, [1, 3])]])
    backend.info = BackendInfo(vocab_size=100, max_context=64, tokenizer_fingerprint="tok1-test-100-fp", params=1, kv_bytes_per_token=8,
                               description={}, can_verify_trees=True)
    verifier = Verifier(config, backend)
    assert verifier.limits.max_tree_tokens == config.max_tree_tokens
    state = verifier.start(request([1, 2]))
    (verdict,) = verifier.step([VerifyItem(state, DraftBlock(0, [10, 11, 12, 13], parents=[-1, -1, 1, 1]))])
    assert backend.batches[0][0].parents == [-1, -1, 1, 1]
    assert (verdict.accepted, verdict.next_token, verdict.accepted_path) == (2, 77, [1, 3])
    assert state.committed == [1, 2, 11, 13, 77] and not state.last_full  # nothing goes ahead of a tree


def test_a_fully_accepted_chain_lets_the_next_block_go_ahead(config):
    backend = ScriptedBackend([[(3, 50)], [(1, 60)]])
    verifier = Verifier(config, backend)
    state = verifier.start(request([1, 2]))
    verifier.step([VerifyItem(state, DraftBlock(0, [10, 11, 12]))])
    assert state.last_full
    verifier.step([VerifyItem(state, DraftBlock(1, [13, 14]))])
    assert not state.last_full


def test_trees_are_off_where_the_model_cannot_verify_them(config):
    verifier = Verifier(config, ScriptedBackend([]))  # can_verify_trees defaults to False
    assert verifier.limits.max_tree_tokens == 0


class FailingRowBackend(ScriptedBackend):
    """A batch forward fails when a given session is in it; alone, the others are fine."""

    def __init__(self, bad_key):
        super().__init__([])
        self.bad_key = bad_key

    def verify(self, rows):
        self.batches.append(rows)
        if any(row.key == self.bad_key for row in rows):
            raise ValueError(f"row of session {self.bad_key} failed")
        return [Outcome(0, 42) for _ in rows]


def test_a_failing_row_fails_only_its_own_session(config):
    backend = FailingRowBackend(bad_key=2)
    verifier = Verifier(config, backend)
    a, b, c = (verifier.start(request([1, 2])) for _ in range(3))
    assert b.cache_key == 2
    results = verifier.step([VerifyItem(s, DraftBlock(0, [5])) for s in (a, b, c)])
    assert isinstance(results[1], ValueError)
    assert results[0].next_token == 42 and results[2].next_token == 42
    assert a.committed == [1, 2, 42] and b.committed == [1, 2] and c.committed == [1, 2, 42]
    assert [len(batch) for batch in backend.batches] == [3, 1, 1, 1]  # the batch, then each alone


def test_prefill_is_one_job_per_chunk(config):
    from edgespec.cloud.serving.engine import PREFILL_CHUNK

    backend = ScriptedBackend([])
    backend.info = BackendInfo(vocab_size=50, max_context=4096, tokenizer_fingerprint="tok1-test-100-fp", params=1, kv_bytes_per_token=8, description={})
    calls = []
    backend.extend = lambda key, tokens: calls.append(len(tokens))
    verifier = Verifier(config, backend)
    state = verifier.admit(request([1 + i % 40 for i in range(PREFILL_CHUNK * 2 + 11)]))
    jobs = verifier.prefill_jobs(state)
    for job in jobs:
        job()
    assert len(jobs) == 1 + 3 and calls == [PREFILL_CHUNK, PREFILL_CHUNK, 10]  # open, then three chunks
