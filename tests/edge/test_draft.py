"""The ONNX draft on the device: propose, rollback, validation, the manifest, and no torch."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from edgespec.edge.lookup import LookupConfig
from edgespec.edge.manifest import DraftManifest, past_input_names, present_output_names
from edgespec.edge.sampling import SamplingParams, round_rng

K = 5
PARAMS = SamplingParams(temperature=0.9, top_p=0.95, seed=11)


@pytest.fixture(scope="module")
def draft_dir(tiny_pair):
    return tiny_pair.draft_dir


@pytest.fixture(scope="module")
def prompt(draft_dir):
    from edgespec.edge.tokenizer import load_tokenizer

    return load_tokenizer(draft_dir).encode("import sys\n\ndef main(argv):\n    return").ids


def new_draft(draft_dir, context=None):
    from edgespec.edge.draft import DraftModel

    draft = DraftModel(draft_dir)
    if context is not None:
        draft.reset(context)
    return draft


def assert_same_proposal(a, b):
    assert a.tokens == b.tokens
    if a.q is None or b.q is None:
        assert a.q is None and b.q is None
        return
    for qa, qb in zip(a.q, b.q, strict=True):
        np.testing.assert_array_equal(qa.token_ids, qb.token_ids)
        # NOTE: the cached and the fresh path feed different chunkings, so logits (and q) agree
        # to float noise, not bit for bit.
        np.testing.assert_allclose(qa.probs, qb.probs, atol=1e-5, rtol=0)


def test_edge_package_does_not_import_torch():
    code = (
        "import sys, edgespec.edge.draft, edgespec.edge.sampling, edgespec.edge.manifest\n"
        "print(sorted(m for m in ('torch', 'transformers', 'ray') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.slow
def test_propose_runs_k_forwards_and_leaves_the_last_draft_pending(draft_dir, prompt):
    draft = new_draft(draft_dir, prompt)
    proposal = draft.propose(K)
    assert len(proposal.tokens) == K and proposal.q is None and proposal.draft_ms > 0
    assert draft.tokens == prompt + proposal.tokens
    assert draft.cache_len == len(draft.tokens) - 1
    assert draft.stats.forwards == K and draft.stats.fed_tokens == len(prompt) + K - 1
    assert draft.stats.draft_ms > 0 and draft.stats.drafted_tokens > 0
    # Reference: recompute the whole context from scratch for every draft.
    context = list(prompt)
    for _ in range(K):
        context.append(int(draft.logits_for_context(context)[-1].argmax()))
    assert context == draft.tokens


@pytest.mark.slow
@pytest.mark.parametrize("lookup", [None, LookupConfig()], ids=["model", "lookup"])
def test_observe_predicts_what_propose_would_have_drafted_at_each_token(draft_dir, prompt, lookup):
    """Tokens streamed by the cloud: observe returns, for each, the token a one-draft proposal
    from the context before it gives, and leaves the context (and a usable cache) after them."""
    draft, fresh = new_draft(draft_dir, prompt), new_draft(draft_dir)
    streamed = [(t * 7 + 3) % draft.vocab_size for t in prompt[:5]] + prompt[:6]  # a repeat, for lookup
    predicted = draft.observe(streamed[:4], lookup) + draft.observe(streamed[4:], lookup)  # two chunks
    expected = []
    for i in range(len(streamed)):
        fresh.reset(prompt + streamed[:i])
        expected.append(fresh.propose(1, lookup=lookup).tokens[0])
    assert predicted == expected
    assert draft.tokens == prompt + streamed and draft.cache_len == len(draft.tokens) - 1
    fresh.reset(prompt + streamed)
    assert draft.propose(K, lookup=lookup).tokens == fresh.propose(K, lookup=lookup).tokens


@pytest.mark.slow
@pytest.mark.parametrize("params", [None, PARAMS], ids=["greedy", "sampling"])
def test_rollback_then_append_equals_a_fresh_reset(draft_dir, prompt, params):
    """For every accepted count n (including all K): the round's rollback + verifier token
    proposes exactly what a fresh draft reset to that prefix proposes."""
    draft = new_draft(draft_dir)
    fresh = new_draft(draft_dir)
    top_n = 8 if params else 0
    for n in range(K + 1):
        draft.reset(prompt)
        drafts = draft.propose(K, sampling=params, rng=round_rng(3, 0), top_n=top_n).tokens
        verifier_token = (drafts[n] + 1) % draft.vocab_size if n < K else 42  # a correction or a bonus
        draft.rollback_to(len(prompt) + n)
        assert draft.cache_len <= len(prompt) + n
        draft.append([verifier_token])
        expected_context = prompt + drafts[:n] + [verifier_token]
        assert draft.tokens == expected_context
        fresh.reset(expected_context)
        assert_same_proposal(draft.propose(K, sampling=params, rng=round_rng(3, 1), top_n=top_n), fresh.propose(K, sampling=params, rng=round_rng(3, 1), top_n=top_n))
        assert draft.tokens == fresh.tokens


@pytest.mark.slow
def test_rollback_to_zero_and_beyond_the_cache(draft_dir, prompt):
    draft = new_draft(draft_dir, prompt)
    draft.propose(K)
    draft.rollback_to(0)
    assert draft.tokens == [] and draft.cache_len == 0
    with pytest.raises(ValueError, match="reset"):
        draft.propose(1)
    draft.append(prompt)
    assert_same_proposal(draft.propose(K), new_draft(draft_dir, prompt).propose(K))

    # Beyond the cache: the last draft is pending, so keeping everything keeps the cache as is.
    cached = draft.cache_len
    draft.rollback_to(len(draft.tokens))
    assert draft.cache_len == cached
    fresh = new_draft(draft_dir, draft.tokens)
    assert_same_proposal(draft.propose(2), fresh.propose(2))
    # Before anything was fed: the cache is empty, only the context shrinks.
    lazy = new_draft(draft_dir, prompt)
    lazy.rollback_to(len(prompt) - 2)
    assert lazy.cache_len == 0
    assert_same_proposal(lazy.propose(3), new_draft(draft_dir, prompt[:-2]).propose(3))
    # Exactly to the cache end: nothing pending, the last token is re-fed.
    draft.rollback_to(draft.cache_len)
    assert draft.cache_len == len(draft.tokens)
    fresh = new_draft(draft_dir, draft.tokens)
    assert_same_proposal(draft.propose(2), fresh.propose(2))
    with pytest.raises(ValueError, match="outside"):
        draft.rollback_to(len(draft.tokens) + 1)


@pytest.mark.slow
def test_greedy_lookup_drafts_the_continuation_of_a_repeated_span(draft_dir):
    from edgespec.edge.lookup import LookupConfig

    context = [5, 6, 7, 8, 9, 5, 6, 7]
    draft = new_draft(draft_dir, context)
    looked_up = draft.propose(4, lookup=LookupConfig(max_n=4, min_n=2))
    assert looked_up.tokens == [8, 9, 5, 6]  # [5, 6, 7] was followed by 8, and so on around the cycle
    assert draft.tokens == context + [8, 9, 5, 6]
    draft.rollback_to(len(context))  # the cache stays consistent: a fresh run agrees
    assert draft.propose(2).tokens == new_draft(draft_dir, context).propose(2).tokens


@pytest.mark.slow
def test_sampling_lookup_drafts_from_a_point_mass_without_running_the_model(draft_dir):
    context = [5, 6, 7, 8, 9, 5, 6, 7]
    draft = new_draft(draft_dir, context)
    looked_up = draft.propose(4, sampling=PARAMS, rng=round_rng(1, 1), top_n=4, lookup=LookupConfig(max_n=4, min_n=2))
    assert looked_up.tokens == [8, 9, 5, 6]  # [5, 6, 7] was followed by 8, and so on around the cycle
    assert all(q.token_ids.tolist() == [t] and q.probs.tolist() == [1.0] for q, t in zip(looked_up.q, looked_up.tokens))
    assert draft.stats.forwards == 0  # the lookup decided every position: nothing was fed yet
    draft.rollback_to(len(context))  # the cache stays consistent: a fresh run agrees
    assert_same_proposal(draft.propose(3, sampling=PARAMS, rng=round_rng(2, 2), top_n=4),
                         new_draft(draft_dir, context).propose(3, sampling=PARAMS, rng=round_rng(2, 2), top_n=4))


@pytest.mark.slow
def test_sampling_lookup_mixes_its_token_into_the_models_q(draft_dir):
    context = [5, 6, 7, 8, 9, 5, 6, 7]
    lookup = LookupConfig(max_n=4, min_n=2)
    a = new_draft(draft_dir, context).propose(1, sampling=PARAMS, rng=round_rng(4, 0), top_n=3, lookup=lookup, lookup_weight=0.5)
    b = new_draft(draft_dir, context).propose(1, sampling=PARAMS, rng=round_rng(4, 0), top_n=3, lookup=lookup, lookup_weight=0.5)
    assert_same_proposal(a, b)
    q = a.q[0]
    assert q.token_ids.size <= 3 and q.prob_of(8) >= 0.5 and q.probs.sum() == pytest.approx(1.0)
    assert q.prob_of(a.tokens[0]) > 0  # drawn from what is sent


@pytest.mark.slow
def test_sampling_is_seeded_and_greedy_ignores_the_rng(draft_dir, prompt):
    a = new_draft(draft_dir, prompt).propose(K, sampling=PARAMS, rng=round_rng(5, 2), top_n=4)
    b = new_draft(draft_dir, prompt).propose(K, sampling=PARAMS, rng=round_rng(5, 2), top_n=4)
    assert_same_proposal(a, b)
    assert all(len(q.token_ids) <= 4 and q.probs.sum() == pytest.approx(1.0) for q in a.q)
    assert all(q.prob_of(t) > 0 for q, t in zip(a.q, a.tokens))  # drawn from what is sent
    greedy = SamplingParams(temperature=0.0, seed=99)
    g1 = new_draft(draft_dir, prompt).propose(K, sampling=greedy, rng=round_rng(1, 0), top_n=4)
    g2 = new_draft(draft_dir, prompt).propose(K)
    assert g1.q is None and g1.tokens == g2.tokens


@pytest.mark.slow
def test_invalid_input_is_refused_with_a_fix(draft_dir, prompt):
    from edgespec.edge.draft import DraftModel

    draft = new_draft(draft_dir, prompt)
    for bad, match in [(lambda: draft.propose(0), "k must be"),
                       (lambda: draft.append([draft.vocab_size]), "outside this draft's vocabulary"),
                       (lambda: draft.reset([-1]), "outside"),
                       (lambda: draft.append([1.5]), "integer token ids"),
                       (lambda: draft.reset([1] * 513), "max_positions 512"),
                       (lambda: DraftModel(draft_dir, threads=-1), "threads")]:
        with pytest.raises(ValueError, match=match):
            bad()
    draft.reset([1] * 510)
    draft.propose(3)  # positions up to 511 are fed: fits
    draft.reset([1] * 510)
    with pytest.raises(ValueError, match="lower k"):
        draft.propose(4)


@pytest.mark.slow
def test_tokenizer_mismatch_is_refused(draft_dir, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(draft_dir, copy)
    data = json.loads((copy / "manifest.json").read_text())
    data["tokenizer_fingerprint"] = "bpe-512-0000000000000000"
    (copy / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="re-export"):
        new_draft(copy)


def _manifest(**overrides) -> DraftManifest:
    fields = dict(
        architecture="LlamaForCausalLM", vocab_size=512, num_layers=2, num_kv_heads=2, head_dim=16,
        max_positions=512, tokenizer_fingerprint="bpe-512-abc", opset=18,
        input_names=["input_ids", "position_ids", *past_input_names(2)],
        output_names=["logits", *present_output_names(2)], eos_token_ids=[0],
    )
    return DraftManifest(**{**fields, **overrides})


def test_manifest_round_trips_and_names_its_layout(tmp_path):
    manifest = _manifest()
    manifest.save(tmp_path)
    assert DraftManifest.load(tmp_path) == manifest
    assert manifest.past_inputs == ["past_key_values.0.key", "past_key_values.0.value", "past_key_values.1.key", "past_key_values.1.value"]
    assert manifest.present_outputs[-1] == "present.1.value" and manifest.logits_output == "logits"


@pytest.mark.parametrize(
    "overrides, field",
    [({"vocab_size": 0}, "vocab_size"), ({"kv_dtype": "int8"}, "kv_dtype"), ({"input_names": ["input_ids"]}, "input_names"),
     ({"eos_token_ids": [600]}, "eos_token_ids"), ({"onnx_file": "../x.onnx"}, "onnx_file"), ({"format_version": 9}, "format_version")],
)
def test_manifest_validation_names_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        _manifest(**overrides)


def test_manifest_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="export-draft"):
        DraftManifest.load(tmp_path)
    data = json.loads(_manifest().to_json())
    (tmp_path / "manifest.json").write_text(json.dumps({**data, "surprise": 1}))
    with pytest.raises(ValueError, match="unknown fields"):
        DraftManifest.load(tmp_path)
    del data["head_dim"]
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="head_dim"):
        DraftManifest.load(tmp_path)


def test_forks_share_weights_but_not_context(draft_dir):
    from edgespec.edge.draft import DraftModel

    base = DraftModel(draft_dir)
    fork = base.fork()
    assert fork.session is base.session
    base.reset([5, 6, 7])
    fork.reset([9, 10])
    a = base.propose(3).tokens
    b = fork.propose(3).tokens
    assert base.tokens == [5, 6, 7, *a] and fork.tokens == [9, 10, *b]
    fresh = DraftModel(draft_dir)
    fresh.reset([9, 10])
    assert fresh.propose(3).tokens == b
