"""The target engine: a padded batch equals each row alone, trimming is a real rollback,
and the cache accounting matches the tensors (tiny random target)."""

from __future__ import annotations

import pytest
import torch

from edgespec.cloud.serving.config import VerifierConfig
from edgespec.cloud.serving.engine import TargetEngine

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def engine(tiny_pair):
    return TargetEngine(VerifierConfig(model=str(tiny_pair.target_dir), device="cpu"))


def session(engine, prefix):
    kv = engine.new_kv()
    engine.prefill(kv, prefix)
    return kv


def test_padded_batch_equals_each_row_alone(engine):
    contexts = [list(range(3, 40)), [7], list(range(100, 108)), []]
    news = [[5, 6, 7], [8], [9, 10, 11, 12, 13], [14, 15]]
    batched = engine.forward([(session(engine, c), n) for c, n in zip(contexts, news)])
    for context, new, logits in zip(contexts, news, batched):
        (alone,) = engine.forward([(session(engine, context), new)])
        assert logits.shape == (len(new), engine.vocab_size)
        torch.testing.assert_close(logits, alone, atol=1e-4, rtol=1e-4)


def test_cached_forward_equals_an_uncached_one(engine):
    tokens = list(range(20, 45))
    kv = session(engine, tokens[:-5])
    (cached,) = engine.forward([(kv, tokens[-5:])])
    with torch.inference_mode():
        full = engine.model(input_ids=torch.tensor([tokens])).logits[0, -5:].float()
    torch.testing.assert_close(cached, full, atol=1e-4, rtol=1e-4)


def test_trim_rolls_back_to_a_shorter_context(engine):
    kv = session(engine, list(range(10, 30)))
    engine.forward([(kv, [1, 2, 3, 4])])  # drafts that will be rejected
    assert kv.length == 24
    engine.trim(kv, 21)
    assert kv.length == 21
    (after,) = engine.forward([(kv, [50])])
    (fresh,) = engine.forward([(session(engine, list(range(10, 30)) + [1]), [50])])
    torch.testing.assert_close(after, fresh, atol=1e-4, rtol=1e-4)
    engine.trim(kv, 30)  # never grows
    assert kv.length == 22


def test_cache_bytes_follow_the_cached_length(engine):
    kv = session(engine, list(range(10, 26)))
    assert kv.nbytes() == 16 * engine.kv_bytes_per_token()
    assert engine.can_batch and engine.max_context > 0 and engine.params > 0


def test_dtype_auto_is_bfloat16_on_a_gpu_and_float32_on_the_cpu(engine):
    from edgespec.cloud.serving.engine import resolve_dtype

    assert engine.config.dtype == "auto" and engine.dtype == torch.float32 and engine.model.dtype == torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("float16", torch.device("cuda")) == torch.float16
    assert engine.path == "paged" and engine.describe()["batch_path"] == "paged"
