"""Targets of every common family, as tiny random models: cached, trimmed and batched forwards
equal an uncached one, and greedy verification equals greedy decoding. Sliding-window targets
(a window shorter than the test's contexts) keep a plain cache with the window in the mask, so
they trim and batch like the others, well past the window."""

from __future__ import annotations

import pytest
import torch

from edgespec.cloud.serving.config import VerifierConfig
from edgespec.cloud.serving.engine import TargetEngine
from edgespec.cloud.training.tiny import build_tiny_family

pytestmark = pytest.mark.slow

torch.set_num_threads(1)

WINDOW = 8
SLIDING = {
    # every layer slides, one mask for all
    "mistral": dict(sliding_window=WINDOW),
    "phi3": dict(sliding_window=WINDOW),
    "starcoder2": dict(sliding_window=WINDOW),
    # layer types: sliding and full layers mixed, one mask per type
    "gemma3_text": dict(sliding_window=WINDOW, layer_types=["sliding_attention"] * 3 + ["full_attention"]),
    "gemma2": dict(sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"] * 2),
    "qwen2": dict(sliding_window=WINDOW, use_sliding_window=True, max_window_layers=2),
}
PLAIN = ("llama", "qwen3", "gemma", "gpt2", "gpt_neox", "opt", "falcon", "codegen", "bloom", "qwen2_moe", "mixtral")
# ALiBi (bloom) builds its bias from a 2D mask and refuses our 4D one: it is verified one session
# at a time (the check at load finds out), still losslessly.
UNBATCHED = {"bloom"}
# Falcon computed its own attention (not through transformers' attention interface) until
# transformers 5.25, so it could not read the KV pool and the engine's check at load sent it to
# the padded batch (padded.py); from 5.25 it takes the packed path like the others. Either is right:
# the check decides, not the version.
EITHER = {"falcon"}
# The padded batch, forced (the packed check made to fail), on the family that once needed it, a
# plain one and two windowed ones (one mask; one per layer type): the path every model whose
# attention bypasses the interface takes, whichever families those are in the installed transformers.
FORCED_PADDED = {"falcon-padded": ("falcon", {}), "llama-padded": ("llama", {}),
                 "mistral-window-padded": ("mistral", SLIDING["mistral"]), "gemma2-window-padded": ("gemma2", SLIDING["gemma2"])}
FAMILIES = {**{f"{name}-window": (name, extra) for name, extra in SLIDING.items()}, **{name: (name, {}) for name in PLAIN},
            **FORCED_PADDED}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def engine(request, tmp_path_factory):
    family, extra = FAMILIES[request.param]
    model_dir = build_tiny_family(tmp_path_factory.mktemp(request.param), family, **extra)
    with pytest.MonkeyPatch.context() as patch:
        if request.param in FORCED_PADDED:
            patch.setattr(TargetEngine, "_packed_matches_plain", lambda self: False)
        engine = TargetEngine(VerifierConfig(model=str(model_dir), device="cpu"))
    assert engine.can_batch is (family not in UNBATCHED)
    if request.param in FORCED_PADDED:
        assert engine.path == "padded"
    elif family in EITHER:
        assert engine.path in ("paged", "padded")
    else:
        assert engine.path == ("single" if family in UNBATCHED else "paged")
    return engine


def uncached(engine, tokens, last):
    with torch.inference_mode():
        return engine.model(input_ids=torch.tensor([tokens])).logits[0, -last:].float()


def test_the_window_is_real(engine):
    if engine.window is None:
        assert "sliding_attention" not in engine.layer_types
        return
    assert engine.window == WINDOW and engine.can_batch
    if "full_attention" in engine.layer_types:
        return
    # every layer slides: a token further back than layers x (window - 1) cannot reach the last one
    reach = len(engine.layer_types) * (WINDOW - 1)
    tokens = list(range(20, 20 + reach + 4))
    results = []
    for first in (tokens[0], tokens[0] + 100):
        kv = engine.new_kv()
        engine.prefill(kv, [first] + tokens[1:-2])
        (logits,) = engine.forward([(kv, tokens[-2:])])
        results.append(logits[-1])
    torch.testing.assert_close(results[0], results[1], atol=1e-5, rtol=1e-5)


def test_rounds_past_the_window_with_rejections_equal_an_uncached_forward(engine):
    committed = list(range(30, 30 + WINDOW - 2))
    kv = engine.new_kv()
    engine.prefill(kv, committed)
    for step in range(6):  # each round: 4 new tokens, the last 2 rejected
        new = [40 + step, 41 + step, 42 + step, 43 + step]
        (logits,) = engine.forward([(kv, new)])
        torch.testing.assert_close(logits, uncached(engine, committed + new, len(new)), atol=1e-4, rtol=1e-4)
        committed += new[:2]
        engine.trim(kv, len(committed))
    assert len(committed) > 2 * WINDOW and kv.length == len(committed)


def test_a_padded_batch_across_the_window_equals_each_row_alone(engine):
    contexts = [list(range(3, 3 + 3 * WINDOW)), [7], list(range(100, 100 + WINDOW + 1)), []]
    news = [[5, 6, 7], [8], [9, 10, 11, 12, 13], [14, 15]]

    def session(prefix):
        kv = engine.new_kv()
        engine.prefill(kv, prefix)
        return kv

    batched = engine.forward([(session(c), n) for c, n in zip(contexts, news)])
    for context, new, logits in zip(contexts, news, batched):
        torch.testing.assert_close(logits, uncached(engine, context + new, len(new)), atol=1e-4, rtol=1e-4)


def test_a_tree_row_past_the_window_sees_only_its_ancestors_inside_it(engine):
    if not engine.can_batch:
        with pytest.raises(ValueError, match="tree drafts need"):
            engine.forward([(engine.new_kv(), [1, 2])], trees=[[-1, 0]])
        return
    context = list(range(50, 50 + 2 * WINDOW))
    kv, other = engine.new_kv(), engine.new_kv()
    engine.prefill(kv, context)
    engine.prefill(other, [1, 2, 3])
    tree = [-1, 0, 0, 1, 2]  # pending token, two children, one grandchild each
    tokens = [60, 61, 62, 63, 64]
    logits, _ = engine.forward([(kv, tokens), (other, [9])], trees=[tree, None])
    for path in ([0, 1, 3], [0, 2, 4]):
        chain = [tokens[i] for i in path]
        torch.testing.assert_close(logits[path], uncached(engine, context + chain, len(chain)), atol=1e-4, rtol=1e-4)


def test_greedy_verification_past_the_window_equals_greedy_decoding(engine):
    """Two sessions verified together, drafts half right, 4 windows long: the committed text is
    the target's own greedy decoding, and no session falls back to verifying alone."""
    from edgespec.cloud.serving.backend import LocalBackend
    from edgespec.cloud.serving.session import DraftBlock, OpenRequest
    from edgespec.cloud.serving.verifier import Verifier, VerifyItem
    from edgespec.edge.params import Finish, Mode, SamplingParams

    new_tokens = 4 * WINDOW
    prompts = [list(range(5, 5 + WINDOW + 3)), [17, 18, 19]]
    references = []
    for prompt in prompts:  # greedy by uncached forwards: transformers applies the window itself
        ids = list(prompt)
        for _ in range(new_tokens):
            ids.append(int(uncached(engine, ids, 1)[-1].argmax()))
        references.append(ids[len(prompt):])
    verifier = Verifier(engine.config, LocalBackend(engine.config))
    states = [verifier.start(OpenRequest(
        prompt_ids=prompt, sampling=SamplingParams(), mode=Mode.GREEDY, mode_number=1,
        tokenizer_fingerprint=engine.tokenizer_fingerprint, max_new_tokens=new_tokens, stop_token_ids=[]))
        for prompt in prompts]
    while any(state.finish is Finish.NONE for state in states):
        items = []
        for state, reference in zip(states, references):
            if state.finish is not Finish.NONE:
                continue
            done = state.generated
            right = reference[done : done + 2]
            drafts = right + [(t + 1) % engine.vocab_size for t in reference[done + 2 : done + 4]]  # 2 right, 2 wrong
            items.append(VerifyItem(state, DraftBlock(state.next_round, drafts) if drafts else None))
        verdicts = verifier.step(items)
        assert not any(isinstance(v, Exception) for v in verdicts)
        assert len(items) < 2 or all(v.batch_size == 2 for v in verdicts)  # one forward for both
    for state, prompt, reference in zip(states, prompts, references):
        assert state.committed[len(prompt):] == reference


@pytest.mark.parametrize("path", ["paged", "padded"])
def test_a_five_token_vocabulary_still_batches(tmp_path, path):
    """The checks at load feed their own token ids: they must fit any vocabulary. With ids past a
    5-token one both checks once failed, and the sampling-fit target was verified one session
    at a time."""
    from edgespec.cloud.training.tiny import build_tiny_vocab_pair

    pair = build_tiny_vocab_pair(tmp_path)
    with pytest.MonkeyPatch.context() as patch:
        if path == "padded":
            patch.setattr(TargetEngine, "_packed_matches_plain", lambda self: False)
        engine = TargetEngine(VerifierConfig(model=str(pair.target_dir), device="cpu", max_context=64))
    assert engine.vocab_size == 5 and engine.path == path
    contexts, news = ([1, 2, 3, 4, 1, 2], [3, 4]), ([0, 1], [2])
    rows = [engine.new_kv() for _ in contexts]
    for kv, context in zip(rows, contexts):
        engine.prefill(kv, context)
    batched = engine.forward(list(zip(rows, news)))
    for logits, context, new in zip(batched, contexts, news):
        torch.testing.assert_close(logits, uncached(engine, context + new, len(new)), atol=1e-4, rtol=1e-4)
