"""The lookup-only drafter: drafts from the context alone, with point-mass q when sampling."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from edgespec.edge.lookup_draft import LookupDraft
from edgespec.edge.params import SamplingParams
from edgespec.edge.sampling import round_rng

MODEL = SimpleNamespace(manifest=SimpleNamespace(max_positions=512), tokenizer=None, vocab_size=50, eos_token_ids=[0])


def drafter(context):
    draft = LookupDraft(MODEL)
    draft.reset(context)
    return draft


def test_drafts_the_continuation_of_a_repeated_span():
    draft = drafter([5, 6, 7, 8, 9, 5, 6, 7])
    assert draft.propose(4).tokens == [8, 9, 5, 6]
    assert draft.tokens == [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]


def test_falls_back_to_what_followed_the_last_token_then_to_the_last_token():
    assert drafter([4, 9, 1, 2, 9]).propose(1).tokens == [1]  # no 2-gram repeats; 9 was followed by 1
    assert drafter([1, 2, 3]).propose(2).tokens == [3, 3]  # nothing repeats: the last token again


def test_sampling_sends_a_point_mass_per_draft_and_is_seeded():
    params = SamplingParams(temperature=0.8, seed=3)
    a = drafter([5, 6, 7, 5, 6]).propose(3, sampling=params, rng=round_rng(3, 1))
    b = drafter([5, 6, 7, 5, 6]).propose(3, sampling=params, rng=round_rng(3, 1))
    assert a.tokens == b.tokens == [7, 5, 6]
    for dist, token in zip(a.q, a.tokens):
        assert dist.token_ids.tolist() == [token] and dist.probs.tolist() == [1.0]
    assert drafter([5, 6]).propose(2).q is None  # greedy: no q


def test_rollback_append_and_observe_keep_the_context():
    draft = drafter([5, 6, 7, 5, 6])
    draft.propose(3)
    draft.rollback_to(5)
    draft.append([9])
    assert draft.tokens == [5, 6, 7, 5, 6, 9]
    assert draft.observe([5, 6]) == [9, 6]  # what it would have drafted before each streamed token
    assert draft.tokens == [5, 6, 7, 5, 6, 9, 5, 6]
    with pytest.raises(ValueError, match="outside"):
        draft.rollback_to(99)


def test_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="runner-up"):
        drafter([1, 2]).propose(2, alternatives=True)
    with pytest.raises(ValueError, match="vocabulary"):
        drafter([1, 2]).append([50])
    with pytest.raises(ValueError, match="rng"):
        drafter([1, 2]).propose(1, sampling=SamplingParams(temperature=1.0))
    with pytest.raises(ValueError, match="empty"):
        LookupDraft(MODEL).propose(1)
    assert np.isscalar(drafter([1]).propose(1).tokens[0])
