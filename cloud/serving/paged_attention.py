"""Attention over the KV pool, packed: one forward for many sessions, no padding, no cache copy.

A batch of B rows runs as ONE sequence of T = sum(n_b) new tokens (``input_ids`` [1, T]), each
token at its own position (``position_ids`` [1, T]: L_b + depth). The model computes queries,
keys and values for those T tokens as usual (rotary embeddings included); this module's
attention function, registered with transformers' ``AttentionInterface``, then per layer

1. writes the T new keys and values into their pool slots (``index_copy_``: only new tokens);
2. reads every row's own L_b + n_b keys from the pool by slot index (one ``index_select`` for
   all rows) and, for each row b, runs attention for its n_b queries against its own keys with
   the row's mask (causal for a chain, the ancestors for a tree, the window on sliding layers).

So no row attends over another row's keys or over padding, and nothing of a session's cache
is ever copied into a batch structure and back. Step 2's ``index_select`` reads the row's keys
into a transient tensor (a paged-attention kernel does that read in registers; plain torch
cannot): ``Step.gathered_bytes`` counts it. Row masks are built on the host and sent to the
device in one transfer per forward.

The function is registered under a name unique to the engine and switched on for the length
of one forward only (``PagedAttention.active``): any other call of the model (``generate()``,
a reference forward in a test) runs its usual implementation.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import count

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from edgespec.cloud.serving.kv_pool import KVPool

_names = count()


@dataclass
class RowPlan:
    """Where row b's tokens are: queries [start, end) of the packed sequence; keys at ``slots``."""

    start: int
    end: int
    key_start: int  # the row's keys are [key_start, key_end) of the step's read_slots
    key_end: int
    full_mask: torch.Tensor | None  # [n_b, L_b + n_b] bool (True: visible); None: every key visible
    sliding_mask: torch.Tensor | None  # the same narrowed to the window (sliding layers)


@dataclass
class Step:
    """One packed forward: where the new tokens go and what each row sees."""

    write_slots: torch.Tensor  # [T] the new tokens' slots
    read_slots: torch.Tensor  # [sum (L_b + n_b)] every row's key slots, row after row
    rows: list[RowPlan]
    sliding_layers: frozenset[int]
    layers_seen: set[int] = field(default_factory=set)
    gathered_bytes: int = 0  # keys and values the rows read by slot per forward, all layers


def row_masks(length: int, positions: list[int], ancestors: list[list[int]], window: int | None, device):
    """Masks of one row: ``length`` cached keys at positions 0..length-1, then its new tokens
    (at ``positions``), each new token seeing its ``ancestors`` (itself included)."""
    n = len(positions)
    chain = all(a == list(range(i + 1)) for i, a in enumerate(ancestors))
    visible = torch.ones(n, length + n, dtype=torch.bool)
    if not chain:
        visible[:, length:] = False
        for i, seen in enumerate(ancestors):
            visible[i, [length + a for a in seen]] = True
    elif n > 1:
        visible[:, length:] = torch.ones(n, n, dtype=torch.bool).tril()
    full = None if chain and n == 1 else visible
    sliding = None
    if window is not None:
        query = torch.tensor(positions)[:, None]
        keys = torch.cat([torch.arange(length), torch.tensor(positions)])[None, :]
        inside = (query - keys) < window
        if not bool(inside.all()):
            sliding = (visible & inside).to(device)
        else:
            sliding = None if full is None else full.to(device)
    return (None if full is None else full.to(device)), sliding


def chain_masks(length: int, n: int, window: int | None, device):
    """``row_masks`` of a chain (new token i at position length + i), built on the device in one
    op: key j is visible to query i when j <= length + i (and, sliding, length + i - j < window)."""
    full = None if n == 1 else torch.ones(n, length + n, dtype=torch.bool, device=device).tril_(length)
    if window is None or length + n <= window:
        return full, full
    base = full if full is not None else torch.ones(n, length + n, dtype=torch.bool, device=device)
    return full, base.triu(length - window + 1)


class PagedAttention:
    """The attention function bound to one pool, and the switch that turns it on."""

    def __init__(self, pool: KVPool, model):
        self.pool = pool
        self.model = model
        self.name = f"edgespec_paged_{next(_names)}"
        self.step: Step | None = None
        AttentionInterface.register(self.name, self._attend)
        # Every config object the model's modules read their implementation from.
        self._configs = {id(m.config): m.config for m in model.modules() if hasattr(getattr(m, "config", None), "_attn_implementation_internal")}

    @contextmanager
    def active(self, step: Step):
        saved = {key: config._attn_implementation_internal for key, config in self._configs.items()}
        self.step = step
        for config in self._configs.values():
            config._attn_implementation_internal = self.name
        try:
            yield
        finally:
            self.step = None
            for key, config in self._configs.items():
                config._attn_implementation_internal = saved[key]

    def _attend(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None, s_aux=None, **_):
        """query [1, H_q, T, D], key/value [1, H_kv, T, D] -> ([1, T, H_q, D_v], None)."""
        step = self.step
        if step is None:
            raise RuntimeError("the paged attention ran outside a paged forward")
        if s_aux is not None:
            raise NotImplementedError("attention sinks are not supported by the paged path")
        layer = module.layer_idx
        step.layers_seen.add(layer)
        keys, values = self.pool.layer(layer, key.shape[1], key.shape[3], value.shape[3])
        keys.index_copy_(1, step.write_slots, key[0].to(keys.dtype))
        values.index_copy_(1, step.write_slots, value[0].to(values.dtype))
        scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
        sliding = layer in step.sliding_layers
        groups = query.shape[1] // key.shape[1]
        # One read of every row's keys and values (two kernels per layer, not two per row).
        all_keys, all_values = keys.index_select(1, step.read_slots), values.index_select(1, step.read_slots)
        outputs = []
        for row in step.rows:
            row_keys = all_keys[None, :, row.key_start : row.key_end]  # [1, H_kv, L_b + n_b, D]
            row_values = all_values[None, :, row.key_start : row.key_end]
            mask = row.sliding_mask if sliding else row.full_mask
            outputs.append(_attention(query[:, :, row.start : row.end], row_keys, row_values, mask, scale, softcap, groups))
        out = torch.cat(outputs, dim=2) if len(outputs) > 1 else outputs[0]
        return out.transpose(1, 2).contiguous(), None


def _attention(query, keys, values, mask, scale: float, softcap: float | None, groups: int) -> torch.Tensor:
    """[1, H_q, n, D] queries against [1, H_kv, K, D] keys; mask [n, K] bool or None."""
    if softcap is None:
        return F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=scale, enable_gqa=groups > 1)
    if groups > 1:
        keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, keys.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores.float(), dim=-1).to(query.dtype)
    return torch.matmul(weights, values)
