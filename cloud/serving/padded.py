"""The padded batch: the path for families whose attention bypasses transformers' attention
interface (Falcon did before transformers 5.25), so the packed path (``paged_attention.py``)
cannot serve them. Each session keeps its own ``DynamicCache``.

A batch of sessions with context lengths L_b and n_b new tokens runs as one padded forward:

    past   [B, H, Lmax, D]  each row's cache right-aligned, left padding masked out
    input  [B, N]           each row's new tokens left-aligned, right padding (ignored)
    positions               L_b + depth of each new token

Each row's cache is copied into the batch cache and sliced back out afterwards: O(B x Lmax) bytes
per forward and attention over Lmax for every row, which the packed path exists to avoid. Sliding
layers take the window in the mask (by positions, transformers' rule), trees a 4D ancestor mask.
Every function takes the ``TargetEngine`` as ``self`` and runs on its model thread.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

from edgespec.cloud.serving.trees import tree_ancestors, tree_depths

if TYPE_CHECKING:  # engine.py imports this module
    from transformers import DynamicCache

    from edgespec.cloud.serving.engine import SessionKV

log = logging.getLogger(__name__)


def cache_layers(cache: DynamicCache) -> list[Any]:
    """A transformers cache's layers, of whatever kind (plain, sliding, linear, chunked...): the
    callers check ``is_initialized`` and ``keys`` at run time, so they are not typed here."""
    return list(cache.layers)


def forward_padded(self, rows: list[tuple[SessionKV, list[int]]], trees: list[list[int] | None]) -> list[torch.Tensor]:
    batch = len(rows)
    lengths = [kv.length for kv, _ in rows]
    counts = [len(tokens) for _, tokens in rows]
    lmax, nmax = max(lengths), max(counts)
    input_ids = torch.zeros(batch, nmax, dtype=torch.long)
    positions = torch.zeros(batch, nmax, dtype=torch.long)
    # visible[b, i, j]: new token i of row b may attend to key j (past, then new tokens).
    visible = torch.zeros(batch, nmax, lmax + nmax, dtype=torch.bool)
    for b, ((kv, tokens), length, n, tree) in enumerate(zip(rows, lengths, counts, trees)):
        input_ids[b, :n] = torch.tensor(tokens)
        visible[b, :, lmax - length : lmax] = True  # the row's own context, right-aligned
        depth = tree_depths(tree, n)
        # Padding positions only need to be valid indices; their outputs are dropped.
        positions[b, :n] = (length + torch.tensor(depth)).clamp_max(self.max_context - 1)
        positions[b, n:] = torch.arange(length + n, length + nmax).clamp_max(self.max_context - 1)
        for i, ancestors in enumerate(tree_ancestors(tree, n)):
            visible[b, i, [lmax + a for a in ancestors]] = True
        for i in range(n, nmax):  # padding queries see themselves: no empty softmax row
            visible[b, i, lmax + i] = True
    cache = stack_caches(self, [kv for kv, _ in rows], lmax)
    out = self.model(
        input_ids=input_ids.to(self.device),
        position_ids=positions.to(self.device),
        attention_mask=padded_masks(self, visible, positions, lengths, lmax),
        cache=cache,
        use_cache=True,
    )
    logits = out.logits.float().cpu()
    for b, ((kv, _), length, n) in enumerate(zip(rows, lengths, counts)):
        for layer, batch_layer in zip(cache_layers(kv.cache), cache_layers(cache)):
            keys = batch_layer.keys[b : b + 1, :, lmax - length : lmax + n]
            values = batch_layer.values[b : b + 1, :, lmax - length : lmax + n]
            if not layer.is_initialized:
                layer.lazy_initialization(keys, values)
            layer.keys, layer.values = keys, values
        kv.length = length + n
    return [logits[b, :n] for b, n in enumerate(counts)]

def padded_masks(self, visible: torch.Tensor, positions: torch.Tensor, lengths: list[int], lmax: int):
    """The additive 4D mask(s) of a padded forward: ``visible`` [B, N, lmax + N] as is for
    full attention, narrowed to the window for sliding layers (by the keys' and queries'
    positions, not their slots)."""
    dtype = self.model.dtype

    def additive(allowed: torch.Tensor) -> torch.Tensor:
        return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)[:, None].to(self.device)

    if self.window is None:
        full = additive(visible)
        return {"full_attention": full} if self.mask_per_type else full
    batch = len(lengths)
    key_positions = torch.zeros(batch, visible.shape[-1], dtype=torch.long)
    for b, length in enumerate(lengths):
        key_positions[b, lmax - length : lmax] = torch.arange(length)
    key_positions[:, lmax:] = positions
    inside = (positions[:, :, None] - key_positions[:, None, :]) < self.window
    nmax = positions.shape[1]
    inside[:, torch.arange(nmax), lmax + torch.arange(nmax)] = True  # a query always sees itself
    sliding = additive(visible & inside)
    if not self.mask_per_type:
        return sliding
    return {"full_attention": additive(visible), "sliding_attention": sliding}

def check_rows(self) -> tuple[list[list[int]], list[list[int]]]:
    """Two short rows (contexts, new tokens) for the batching checks at load: the longer context
    crosses a small window; every id fits the vocabulary, even one of 5 tokens."""
    span = self.window + 3 if self.window and self.window <= 64 else 6
    span = min(span, self.max_context - 4)
    generator = torch.Generator().manual_seed(0)
    contexts = [torch.randint(1, self.vocab_size, (n,), generator=generator).tolist() for n in (span, 2)]
    news = [[t % self.vocab_size for t in new] for new in ([1, 2, 3], [4, 5])]
    return contexts, news


def same_logits(self, got: list[torch.Tensor], expected: list[torch.Tensor]) -> bool:
    """Whether a batched check's logits are finite and equal the reference, within the
    tolerance of the serving dtype (relative to each row's largest logit, at least 1)."""
    tolerance = 1e-3 if self.dtype == torch.float32 else 5e-2
    for a, b in zip(got, expected):
        scale = max(1.0, float(b.abs().max()))
        if not torch.isfinite(a).all() or float((a - b).abs().max()) > tolerance * scale:
            return False
    return True


def padded_matches_alone(self) -> bool:
    """Runs two short rows padded and each alone: False when the model does not take our
    masks (its logits differ, or it refuses them). Contexts cross a small window."""
    contexts, news = check_rows(self)
    try:
        with torch.inference_mode():
            rows = []
            for context in contexts:
                kv = self.new_kv()
                self.prefill(kv, context)
                rows.append(kv)
            padded = forward_padded(self, list(zip(rows, news)), [None, None])
            for kv, context in zip(rows, contexts):
                self.trim(kv, len(context))
            alone = [self._forward_one(kv, new) for kv, new in zip(rows, news)]
    except Exception as exc:  # noqa: BLE001 — any refusal means: do not batch this model
        log.warning("the padded forward failed its check: %r", exc)
        return False
    return same_logits(self, padded, alone)

def stack_caches(self, kvs: list[SessionKV], lmax: int) -> DynamicCache:
    """Right-aligns each session's cache into one [B, H, lmax, D] cache per layer."""
    cache = self._new_cache()
    if lmax == 0:
        return cache
    reference = cache_layers(next(kv for kv in kvs if kv.length > 0).cache)
    for index, batch_layer in enumerate(cache_layers(cache)):
        sample = reference[index].keys
        shape = (len(kvs), sample.shape[1], lmax, sample.shape[3])
        keys = sample.new_zeros(shape)
        values = reference[index].values.new_zeros(shape[:3] + (reference[index].values.shape[3],))
        for b, kv in enumerate(kvs):
            if kv.length:
                layer = cache_layers(kv.cache)[index]
                keys[b, :, lmax - kv.length :] = layer.keys[0]
                values[b, :, lmax - kv.length :] = layer.values[0]
        batch_layer.lazy_initialization(keys, values)
        batch_layer.keys, batch_layer.values = keys, values
    return cache

