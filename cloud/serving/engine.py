"""The target model on a replica: per-session KV caches and one padded forward per batch.

Each session owns a transformers ``DynamicCache`` holding its committed context (all but the
pending token). A batch of sessions with different context lengths L_b and different numbers
of new tokens n_b (pending token + k_b drafts) runs as ONE forward:

    past   [B, H, Lmax, D]  each row's cache right-aligned, left padding masked out
    input  [B, N]           each row's new tokens left-aligned, right padding (ignored)
    positions               L_b + j for the j-th new token of row b

so every real token sees exactly its own context, at its own positions. Afterwards each row's
cache is the slice of the batch cache that belongs to it; ``trim`` then rolls it back to the
committed length (rollback is a slice: rejected drafts just fall off the end).

A row may be a *tree* (``parents``: for each new token, the index of its parent among the
row's new tokens, -1 for the first one, the pending token). Its tokens then see the context
and their own ancestors only, at position L_b + depth, through a 4D attention mask; after the
accept rule picked a path, ``keep_path`` compacts the row's cache to the context, the pending
token and the accepted nodes.

One session alone skips the padding and runs on its own cache. Everything here runs on a
single thread (the replica's model executor); nothing is thread-safe by itself.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.cache_utils import DynamicLayer

from edgespec.cloud.serving.config import VerifierConfig
from edgespec.edge.tokenizer import fingerprint, load_tokenizer

log = logging.getLogger(__name__)

PREFILL_CHUNK = 256


@dataclass
class SessionKV:
    """One session's KV cache on the target; ``length`` tokens are cached."""

    cache: DynamicCache
    length: int = 0

    def nbytes(self) -> int:
        total = 0
        for layer in self.cache.layers:
            if getattr(layer, "is_initialized", False) and layer.keys is not None:
                total += layer.keys.numel() * layer.keys.element_size() * 2
        return total


def tree_depths(parents: list[int] | None, n: int) -> list[int]:
    """Depth of each new token (the first, the pending token, is 0); a chain when ``parents`` is None."""
    if parents is None:
        return list(range(n))
    depths: list[int] = []
    for parent in parents:
        depths.append(0 if parent < 0 else depths[parent] + 1)
    return depths


def tree_ancestors(parents: list[int] | None, n: int) -> list[list[int]]:
    """For each new token, itself and its ancestors among the new tokens."""
    if parents is None:
        return [list(range(i + 1)) for i in range(n)]
    out: list[list[int]] = []
    for i, parent in enumerate(parents):
        out.append((out[parent] if parent >= 0 else []) + [i])
    return out


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class TargetEngine:
    """Loads the target and runs prefills and batched verification forwards."""

    def __init__(self, config: VerifierConfig):
        transformers.utils.logging.disable_progress_bar()
        torch.set_num_threads(config.torch_threads)
        self.config = config
        self.device = resolve_device(config.device)
        self.tokenizer = load_tokenizer(config.model)
        self.tokenizer_fingerprint = fingerprint(config.model)
        started = time.perf_counter()
        self.model = AutoModelForCausalLM.from_pretrained(
            config.model, dtype=getattr(torch, config.dtype), local_files_only=True
        ).to(self.device)
        self.model.eval()
        self.load_s = time.perf_counter() - started
        self.params = sum(p.numel() for p in self.model.parameters())
        model_config = self.model.config.get_text_config(decoder=True)
        # The logits' width: ids below it are valid inputs even if the tokenizer is smaller.
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        model_limit = int(getattr(model_config, "max_position_embeddings", 0) or 0)
        if config.max_context and model_limit and config.max_context > model_limit:
            raise ValueError(
                f"max_context {config.max_context} exceeds the model's max_position_embeddings {model_limit}"
            )
        self.max_context = config.max_context or model_limit or 2048
        self.can_batch = all(type(layer) is DynamicLayer for layer in self.new_kv().cache.layers)
        if not self.can_batch:
            log.warning("model %s has non-standard cache layers: verifying sessions one at a time", config.model_id)

    def new_kv(self) -> SessionKV:
        return SessionKV(DynamicCache(config=self.model.config))

    @torch.inference_mode()
    def prefill(self, kv: SessionKV, token_ids: list[int]) -> None:
        """Feeds ``token_ids`` into the session's cache (no logits are needed)."""
        for start in range(0, len(token_ids), PREFILL_CHUNK):
            chunk = token_ids[start : start + PREFILL_CHUNK]
            self._forward_one(kv, chunk, need_logits=False)

    @torch.inference_mode()
    def forward(self, rows: list[tuple[SessionKV, list[int]]], trees: list[list[int] | None] | None = None) -> list[torch.Tensor]:
        """Runs the new tokens of every row; returns each row's logits [n_b, V] (float32, CPU).

        ``trees[b]``: row b's parent indices (see the module docstring), None for a chain.
        Each row's cache grows by its n_b tokens; the caller trims it afterwards.
        """
        trees = trees or [None] * len(rows)
        if (len(rows) == 1 and trees[0] is None) or not self.can_batch:
            if any(tree is not None for tree in trees):
                raise ValueError("tree drafts need a model with standard cache layers (this one verifies one chain at a time)")
            return [self._forward_one(kv, tokens) for kv, tokens in rows]
        return self._forward_padded(rows, trees)

    def keep_path(self, kv: SessionKV, start: int, path: list[int]) -> None:
        """Keeps the first ``start`` cached tokens and, after them, only the new tokens at
        offsets ``path`` (in that order): a tree row's cache after its path was accepted."""
        index = torch.tensor(list(range(start)) + [start + i for i in path], dtype=torch.long, device=self.device)
        for layer in kv.cache.layers:
            layer.keys = layer.keys.index_select(2, index)
            layer.values = layer.values.index_select(2, index)
        kv.length = start + len(path)

    def trim(self, kv: SessionKV, length: int) -> None:
        """Rolls a session's cache back to its first ``length`` tokens.

        The cache's own length is what counts: a forward that failed midway may have grown some
        layers without updating ``kv.length``.
        """
        actual = 0
        for layer in kv.cache.layers:
            if getattr(layer, "is_initialized", False) and layer.keys is not None:
                cached = layer.keys.shape[-2]
                actual = max(actual, cached)
                if cached > length:
                    layer.crop(length - cached)  # crop takes minus the number of tokens to drop
        kv.length = min(length, actual)

    def _forward_one(self, kv: SessionKV, tokens: list[int], need_logits: bool = True) -> torch.Tensor | None:
        n = len(tokens)
        input_ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        positions = torch.arange(kv.length, kv.length + n, device=self.device)[None, :]
        out = self.model(
            input_ids=input_ids,
            position_ids=positions,
            cache=kv.cache,
            use_cache=True,
            logits_to_keep=0 if need_logits else 1,
        )
        kv.length += n
        return out.logits[0].float().cpu() if need_logits else None

    def _forward_padded(self, rows: list[tuple[SessionKV, list[int]]], trees: list[list[int] | None]) -> list[torch.Tensor]:
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
        dtype = self.model.dtype
        mask = torch.zeros(visible.shape, dtype=dtype).masked_fill(~visible, torch.finfo(dtype).min)[:, None]
        cache = self._stack_caches([kv for kv, _ in rows], lmax)
        out = self.model(
            input_ids=input_ids.to(self.device),
            position_ids=positions.to(self.device),
            attention_mask=mask.to(self.device),
            cache=cache,
            use_cache=True,
        )
        logits = out.logits.float().cpu()
        for b, ((kv, _), length, n) in enumerate(zip(rows, lengths, counts)):
            for layer, batch_layer in zip(kv.cache.layers, cache.layers):
                keys = batch_layer.keys[b : b + 1, :, lmax - length : lmax + n]
                values = batch_layer.values[b : b + 1, :, lmax - length : lmax + n]
                if not layer.is_initialized:
                    layer.lazy_initialization(keys, values)
                layer.keys, layer.values = keys, values
            kv.length = length + n
        return [logits[b, :n] for b, n in enumerate(counts)]

    def _stack_caches(self, kvs: list[SessionKV], lmax: int) -> DynamicCache:
        """Right-aligns each session's cache into one [B, H, lmax, D] cache per layer."""
        cache = DynamicCache(config=self.model.config)
        if lmax == 0:
            return cache
        reference = next(kv for kv in kvs if kv.length > 0)
        for index, batch_layer in enumerate(cache.layers):
            sample = reference.cache.layers[index].keys
            shape = (len(kvs), sample.shape[1], lmax, sample.shape[3])
            keys = sample.new_zeros(shape)
            values = reference.cache.layers[index].values.new_zeros(shape[:3] + (reference.cache.layers[index].values.shape[3],))
            for b, kv in enumerate(kvs):
                if kv.length:
                    layer = kv.cache.layers[index]
                    keys[b, :, lmax - kv.length :] = layer.keys[0]
                    values[b, :, lmax - kv.length :] = layer.values[0]
            batch_layer.lazy_initialization(keys, values)
            batch_layer.keys, batch_layer.values = keys, values
        return cache

    def kv_bytes_per_token(self) -> int:
        cfg = self.model.config.get_text_config(decoder=True)
        heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return 2 * cfg.num_hidden_layers * heads * head_dim * torch.finfo(getattr(torch, self.config.dtype)).bits // 8

    def describe(self) -> dict:
        return {
            "model": str(Path(self.config.model).resolve()),
            "device": str(self.device),
            "vocab_size": self.vocab_size,
            "max_context": self.max_context,
            "params": self.params,
            "load_s": round(self.load_s, 2),
        }
