"""The KV pool: pages are owned by one session at a time, come back on every way a session ends,
an empty pool refuses with RESOURCE_EXHAUSTED, and a packed forward leaves every other cache
where it is (tiny random target; the family matrix is in test_engine_families.py)."""

from __future__ import annotations

import gc

import grpc
import pytest
import torch

from edgespec.cloud.serving.accept import Row
from edgespec.cloud.serving.backend import LocalBackend
from edgespec.cloud.serving.config import VerifierConfig
from edgespec.cloud.serving.engine import TargetEngine
from edgespec.cloud.serving.kv_pool import KVPool, PagedKV, PoolExhausted
from edgespec.edge.errors import ServerError
from edgespec.edge.params import Mode, SamplingParams

torch.set_num_threads(1)


def small_pool(pages: int = 4) -> KVPool:
    return KVPool(num_layers=1, num_pages=pages, page_tokens=4, dtype=torch.float32, device=torch.device("cpu"))


def test_sessions_never_share_a_page_and_rollback_frees_whole_pages():
    pool = small_pool(6)
    a, b = PagedKV(pool), PagedKV(pool)
    a.reserve(9)  # 3 pages
    b.reserve(5)  # 2 pages
    assert not set(a.pages) & set(b.pages) and pool.free_pages == 1
    assert set(a.slots(0, 9).tolist()).isdisjoint(b.slots(0, 5).tolist())
    a.length = 9
    a.truncate(5)  # positions 0..4: two pages kept
    assert len(a.pages) == 2 and pool.free_pages == 2
    a.truncate(4)
    assert len(a.pages) == 1 and pool.free_pages == 3
    b.release()
    assert pool.free_pages == 5 and b.pages == [] and b.length == 0


def test_an_empty_pool_refuses_and_a_dropped_session_gives_its_pages_back():
    pool = small_pool(2)
    a = PagedKV(pool)
    a.reserve(8)
    with pytest.raises(PoolExhausted, match="KV pool full"):
        PagedKV(pool).reserve(1)
    del a
    gc.collect()
    assert pool.free_pages == 2


@pytest.fixture(scope="module")
def engine(tiny_pair):
    return TargetEngine(VerifierConfig(model=str(tiny_pair.target_dir), device="cpu"))


def session(engine, prefix):
    kv = engine.new_kv()
    engine.prefill(kv, prefix)
    return kv


def test_mixed_context_lengths_and_a_tree_equal_each_row_alone(engine):
    contexts = [list(range(3, 203)), [7], list(range(100, 190)), list(range(5, 38))]
    news = [[5, 6, 7, 8, 9], [8], [9, 10, 11], [14, 15]]
    trees = [[-1, 0, 0, 1, 2], None, None, None]
    kvs = [session(engine, c) for c in contexts]
    batched = engine.forward(list(zip(kvs, news)), trees)
    first = engine.last_step.rows[0]
    assert first.key_end - first.key_start == 200 + 5  # a row reads its own keys, no padding
    assert engine.last_step.read_slots.numel() == sum(len(c) + len(n) for c, n in zip(contexts, news))
    for context, new, tree, logits in zip(contexts[1:], news[1:], trees[1:], batched[1:]):
        (alone,) = engine.forward([(session(engine, context), new)])
        torch.testing.assert_close(logits, alone, atol=1e-4, rtol=1e-4)
    for path in ([0, 1, 3], [0, 2, 4]):  # each tree path equals the same chain alone
        (alone,) = engine.forward([(session(engine, contexts[0]), [news[0][i] for i in path])])
        torch.testing.assert_close(batched[0][path], alone, atol=1e-4, rtol=1e-4)
    for kv in kvs:
        engine.release(kv)


def test_a_batch_leaves_other_sessions_caches_in_place(engine):
    """Nothing of a cached context moves or changes: a forward only writes its new tokens."""
    kvs = [session(engine, list(range(10, 10 + n))) for n in (40, 3, 17)]
    before = [(engine.pool.keys[0].index_select(1, kv.slots(0, kv.length)).clone(), list(kv.pages)) for kv in kvs]
    pointer = engine.pool.keys[0].data_ptr()
    engine.forward([(kv, [1, 2]) for kv in kvs])
    assert engine.pool.keys[0].data_ptr() == pointer
    for kv, (keys, pages) in zip(kvs, before):
        assert kv.pages[: len(pages)] == pages
        torch.testing.assert_close(engine.pool.keys[0].index_select(1, kv.slots(0, keys.shape[1])), keys, atol=0, rtol=0)
        engine.release(kv)


def test_keep_path_moves_only_the_accepted_nodes(engine):
    context = list(range(20, 50))
    kv = session(engine, context)
    tree, tokens = [-1, 0, 0, 1, 2], [60, 61, 62, 63, 64]
    engine.forward([(kv, tokens)], [tree])
    engine.keep_path(kv, len(context), [0, 2, 4])
    assert kv.length == len(context) + 3
    (after,) = engine.forward([(kv, [70])])
    (chain,) = engine.forward([(session(engine, context + [60, 62, 64]), [70])])
    torch.testing.assert_close(after, chain, atol=1e-4, rtol=1e-4)


def greedy_row(key, cache_len, tokens):
    return Row(key=key, cache_len=cache_len, tokens=tokens, mode=Mode.GREEDY, sampling=SamplingParams(), round_no=0)


def test_pool_exhaustion_is_resource_exhausted_and_every_page_comes_back(tiny_pair):
    config = VerifierConfig(model=str(tiny_pair.target_dir), device="cpu", max_sessions=2, max_context=64)
    backend = LocalBackend(config)
    pool = backend.engine.pool
    total = pool.num_pages
    assert backend.info.kv_page_tokens == pool.page_tokens
    assert backend.info.kv_pool_bytes == total * pool.page_tokens * backend.info.kv_bytes_per_token
    backend.open(1, list(range(5, 5 + pool.page_tokens * (total - 1))))
    with pytest.raises(ServerError) as refused:
        backend.open(2, list(range(5, 5 + 2 * pool.page_tokens)))
    assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    backend.close(2)  # a refused open (the deployment releases it) frees what it took
    assert pool.free_pages == 1
    backend.verify([greedy_row(1, pool.page_tokens * (total - 1), [3, 4])])  # grows into the last page
    assert pool.free_pages == 0
    backend.verify([greedy_row(1, 10, [3])])  # a rollback frees whole pages at once
    assert pool.free_pages == total - 1
    backend.close(1)
    assert pool.free_pages == total
    backend.open(3, list(range(5, 40)))
    backend.shutdown()  # a draining replica frees everything
    assert pool.free_pages == total


def test_row_masks_travel_to_the_device_in_one_piece_and_stay_shared():
    from edgespec.cloud.serving.engine import _to_device
    from edgespec.cloud.serving.paged_attention import chain_masks

    masks = [chain_masks(5, 3, None, "cpu"), chain_masks(9, 1, None, "cpu"), chain_masks(20, 4, 8, "cpu")]
    moved = _to_device(masks, torch.device("meta"))
    assert moved[0][0] is moved[0][1] and moved[1] == (None, None)  # shared stays shared, None stays None
    for (full, sliding), (host_full, host_sliding) in zip(moved[::2], masks[::2]):
        assert full.device.type == "meta" and full.shape == host_full.shape and sliding.shape == host_sliding.shape
    assert _to_device(masks, torch.device("cpu")) is masks
