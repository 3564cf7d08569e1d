"""The target model on a replica: sessions' caches in one KV pool, one packed forward per batch.

Each session's committed context (all but the pending token) lives in pages of the replica's
KV pool (``kv_pool.py``). A batch of sessions with different context lengths L_b and different
numbers of new tokens n_b (pending token + k_b drafts) runs as ONE forward over the packed
sequence of all their new tokens (``paged_attention.py``):

    input_ids, position_ids  [1, sum n_b]   row b's j-th token at position L_b + depth_j
    keys and values          written once into the row's pool slots, read in place by slot

so every real token sees exactly its own context, at its own positions; nothing attends over
padding and no session's cache is copied into a batch structure. ``trim`` rolls a session back
to its committed length (rejected drafts fall off the end; whole pages past it are freed).

A row may be a *tree* (``parents``: for each new token, the index of its parent among the
row's new tokens, -1 for the first one, the pending token). Its tokens then see the context
and their own ancestors only, at position L_b + depth; after the accept rule picked a path,
``keep_path`` moves the accepted nodes' keys next to the context (at most k tokens).

Sliding-window attention (Mistral, Phi-3, StarCoder2, Qwen2 with use_sliding_window, Gemma
2/3 on their sliding layers) keeps every position in the pool and applies the window in the
row's mask: a key at position p_k is visible to a query at p_q on a sliding layer only when
p_q - p_k < window (transformers' own rule). Models with layer types apply it on their sliding
layers, models whose every layer slides on all. A rolling cache could not be rolled back once
the window is reached; the price is memory: a sliding layer holds the whole context, as a full
layer does (which is what ``kv_bytes_per_token`` and the admission budget count).

Families the packed path cannot serve keep a transformers ``DynamicCache`` per session (the
check run at load, on the serving device, decides): one whose attention bypasses transformers'
attention interface (Falcon before transformers 5.25) is batched the old way, padded (``padded.py``); one whose padded
batch does not match either (ALiBi models such as BLOOM build their bias from a 2D mask) or
whose cache layers are of another kind (chunked, linear or shared attention) is verified one
session at a time. Everything here runs on a single thread (the replica's model executor).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import transformers
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.cache_utils import DynamicLayer, get_layer_types_and_kwargs

from edgespec.cloud.serving.config import DEFAULT_MAX_CONTEXT, VerifierConfig
from edgespec.cloud.serving.kv_pool import PAGE_TOKENS, KVPool, PagedKV
from edgespec.cloud.serving.trees import tree_ancestors, tree_depths
from edgespec.cloud.serving.padded import cache_layers, check_rows, forward_padded, padded_matches_alone, same_logits
from edgespec.cloud.serving.paged_attention import PagedAttention, RowPlan, Step, chain_masks, row_masks
from edgespec.edge.tokenizer import fingerprint, load_tokenizer

log = logging.getLogger(__name__)

PREFILL_CHUNK = 256
PLAIN_LAYER_TYPES = ("full_attention", "sliding_attention")  # layers a plain DynamicLayer serves


@dataclass
class SessionKV:
    """One session's own transformers cache (families off the packed path); ``length`` tokens."""

    cache: DynamicCache
    length: int = 0

    def nbytes(self) -> int:
        total = 0
        for layer in cache_layers(self.cache):
            if getattr(layer, "is_initialized", False) and layer.keys is not None:
                total += layer.keys.numel() * layer.keys.element_size() * 2
        return total

    def release(self) -> None:
        self.cache = DynamicCache()
        self.length = 0


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto``: bfloat16 on a GPU, float32 on the CPU; any other name as given."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def _to_device(masks: list[tuple], device: torch.device) -> list[tuple]:
    """Every row's (full, sliding) host masks moved in one transfer; the same tensor stays shared."""
    if device.type == "cpu":
        return masks
    unique = {id(m): m for pair in masks for m in pair if m is not None}
    if not unique:
        return masks
    flat = torch.cat([m.flatten() for m in unique.values()]).to(device)
    moved, offset = {}, 0
    for key, mask in unique.items():
        moved[key] = flat[offset : offset + mask.numel()].view(mask.shape)
        offset += mask.numel()
    return [tuple(None if m is None else moved[id(m)] for m in pair) for pair in masks]


class TargetEngine:
    """Loads the target and runs prefills and batched verification forwards."""

    def __init__(self, config: VerifierConfig):
        transformers.utils.logging.disable_progress_bar()
        torch.set_num_threads(config.torch_threads)
        self.config = config
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.tokenizer = load_tokenizer(config.model)
        self.tokenizer_fingerprint = fingerprint(config.model)
        started = time.perf_counter()
        self.model = cast(Any, AutoModelForCausalLM.from_pretrained(config.model, dtype=self.dtype, local_files_only=True)).to(self.device)
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
        self.max_context = config.max_context or model_limit or DEFAULT_MAX_CONTEXT
        self.layer_types, _ = get_layer_types_and_kwargs(model_config)
        plain_cache = all(kind in PLAIN_LAYER_TYPES for kind in self.layer_types)
        sliding = "sliding_attention" in self.layer_types
        self.window = int(model_config.sliding_window) if sliding and getattr(model_config, "sliding_window", None) else None
        # Models that name their layer types slide on their sliding layers only; the others on
        # every layer when their config has a window.
        if getattr(model_config, "layer_types", None) is not None:
            self.sliding_layers = frozenset(i for i, kind in enumerate(self.layer_types) if kind == "sliding_attention")
        else:
            self.sliding_layers = frozenset(range(len(self.layer_types))) if self.window else frozenset()
        self.page_tokens = PAGE_TOKENS
        self.pool = KVPool(num_layers=len(self.layer_types), num_pages=self._pool_pages(), page_tokens=self.page_tokens,
                           dtype=self.dtype, device=self.device)
        self.paged = PagedAttention(self.pool, self.model)
        self.last_step: Step | None = None
        self.last_logits: torch.Tensor | None = None  # the last forward's logits, packed [sum n_b, V] (None: not packed)
        self.forward_cpu_ns = 0  # this thread's CPU inside packed forwards (bench overhead reads it)
        self.mask_per_type = getattr(model_config, "layer_types", None) is not None  # the padded path's masks
        # The batch path: "paged" (packed, in place), "padded" (families whose attention bypasses
        # the attention interface, padded.py) or "single" (one session per forward).
        self.path = "single"
        if not plain_cache:
            kinds = sorted(set(self.layer_types) - set(PLAIN_LAYER_TYPES))
            log.warning("model %s has %s cache layers: verifying sessions one at a time", config.model_id, kinds)
        elif self._packed_matches_plain():
            self.path = "paged"
        else:
            self.path = "padded"
            if not padded_matches_alone(self):
                self.path = "single"
                log.warning("model %s: neither a packed nor a padded batch matches its rows alone: verifying sessions "
                            "one at a time", config.model_id)
            else:
                log.warning("model %s: its attention cannot read the KV pool: padded batches", config.model_id)
        if self.path != "paged":  # the check's pool tensors are not needed: give the memory back
            self.pool.keys = [None] * len(self.pool.keys)
            self.pool.values = [None] * len(self.pool.values)
        self.can_batch = self.path != "single"

    def _pool_pages(self) -> int:
        """Pages in the pool: the KV budget, and no more than every session at full context needs."""
        page_bytes = self.page_tokens * self.kv_bytes_per_token()
        per_session = self.max_context + max(self.config.max_k, self.config.max_tree_tokens) + 1
        most = self.config.max_sessions * -(-per_session // self.page_tokens)
        return max(1, min(self.config.max_kv_bytes // page_bytes, most))

    def new_kv(self) -> PagedKV | SessionKV:
        if self.path == "paged":
            return PagedKV(self.pool)
        return SessionKV(self._new_cache())

    def _new_cache(self) -> DynamicCache:
        if not all(kind in PLAIN_LAYER_TYPES for kind in self.layer_types):
            return DynamicCache(config=self.model.config)
        cache = DynamicCache()  # full-length layers; the window (if any) is in the mask
        cache.layers.extend(DynamicLayer() for _ in self.layer_types)
        return cache

    def release(self, kv: PagedKV | SessionKV) -> None:
        """Frees the session's cache (its pages go back to the pool)."""
        kv.release()

    @torch.inference_mode()
    def prefill(self, kv: PagedKV | SessionKV, token_ids: list[int]) -> None:
        """Feeds ``token_ids`` into the session's cache (no logits are needed)."""
        for start in range(0, len(token_ids), PREFILL_CHUNK):
            chunk = token_ids[start : start + PREFILL_CHUNK]
            if isinstance(kv, PagedKV):
                self._forward_packed([(kv, chunk)], [None], need_logits=False)
            else:
                self._forward_one(kv, chunk, need_logits=False)

    @torch.inference_mode()
    def forward(self, rows: list[tuple[PagedKV | SessionKV, list[int]]], trees: list[list[int] | None] | None = None) -> list[torch.Tensor]:
        """Runs the new tokens of every row; returns each row's logits [n_b, V] (float32, CPU).

        ``trees[b]``: row b's parent indices (see the module docstring), None for a chain.
        Each row's cache grows by its n_b tokens; the caller trims it afterwards.
        """
        row_trees: list[list[int] | None] = list(trees) if trees else [None] * len(rows)
        self.last_logits = None
        if self.path == "paged":  # every row's cache is a PagedKV on this path
            logits = self._forward_packed(cast(list[tuple[PagedKV, list[int]]], rows), row_trees)
            assert logits is not None
            return logits
        session_rows = cast(list[tuple[SessionKV, list[int]]], rows)  # and a SessionKV on the others
        if self.path == "padded" and (len(rows) > 1 or row_trees[0] is not None):
            return forward_padded(self, session_rows, row_trees)
        if any(tree is not None for tree in row_trees):
            raise ValueError("tree drafts need a model with standard cache layers (this one verifies one chain at a time)")
        return [self._forward_one(kv, tokens) for kv, tokens in session_rows]

    @torch.inference_mode()
    def keep_path(self, kv: PagedKV | SessionKV, start: int, path: list[int]) -> None:
        """Keeps the first ``start`` cached tokens and, after them, only the new tokens at
        offsets ``path`` (in that order): a tree row's cache after its path was accepted."""
        if isinstance(kv, SessionKV):
            index = torch.tensor(list(range(start)) + [start + i for i in path], dtype=torch.long, device=self.device)
            for layer in cache_layers(kv.cache):
                layer.keys = layer.keys.index_select(2, index)
                layer.values = layer.values.index_select(2, index)
            kv.length = start + len(path)
            return
        source = kv.slots(0, kv.length)[[start + i for i in path]].to(self.device)
        target = kv.slots(start, start + len(path)).to(self.device)
        for keys, values in zip(self.pool.keys, self.pool.values):
            if keys is not None and values is not None:  # only the accepted nodes move (index_select reads before the write)
                keys.index_copy_(1, target, keys.index_select(1, source))
                values.index_copy_(1, target, values.index_select(1, source))
        kv.truncate(start + len(path))

    def trim(self, kv: PagedKV | SessionKV, length: int) -> None:
        """Rolls a session's cache back to its first ``length`` tokens.

        The cache's own length is what counts: a forward that failed midway may have grown some
        layers without updating ``kv.length``.
        """
        if isinstance(kv, PagedKV):
            kv.truncate(length)
            return
        actual = 0
        for layer in cache_layers(kv.cache):
            if getattr(layer, "is_initialized", False) and layer.keys is not None:
                cached = layer.keys.shape[-2]
                actual = max(actual, cached)
                if cached > length:
                    layer.crop(length - cached)  # crop takes minus the number of tokens to drop
        kv.length = min(length, actual)

    def _forward_one(self, kv: SessionKV, tokens: list[int], need_logits: bool = True) -> torch.Tensor:
        """The row's logits [n, V] (float32, CPU); without ``need_logits`` an empty tensor."""
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
        return out.logits[0].float().cpu() if need_logits else out.logits[0, :0]

    def _forward_packed(self, rows: list[tuple[PagedKV, list[int]]], trees: list[list[int] | None],
                        need_logits: bool = True) -> list[torch.Tensor] | None:
        """One forward over every row's new tokens, packed (see paged_attention.py)."""
        ids: list[int] = []
        positions: list[int] = []
        reads, writes, masks = [], [], []
        for (kv, tokens), tree in zip(rows, trees):
            length, n = kv.length, len(tokens)
            kv.reserve(length + n)
            window = self.window if self.sliding_layers else None
            if tree is None:
                positions.extend(range(length, length + n))
                masks.append(chain_masks(length, n, window, "cpu"))
            else:
                row_positions = [length + depth for depth in tree_depths(tree, n)]
                positions.extend(row_positions)
                masks.append(row_masks(length, row_positions, tree_ancestors(tree, n), window, "cpu"))
            reads.append(kv.slots(0, length + n))
            writes.append(reads[-1][length:])
            ids.extend(tokens)
        # One transfer each for every row's slots and for every mask; a row's plan holds views.
        masks = _to_device(masks, self.device)
        plans, start, offset = [], 0, 0
        for (_, tokens), row_reads, (full, sliding) in zip(rows, reads, masks):
            count = row_reads.numel()
            plans.append(RowPlan(start, start + len(tokens), offset, offset + count, full, sliding))
            start, offset = start + len(tokens), offset + count
        step = Step(torch.cat(writes).to(self.device), torch.cat(reads).to(self.device), plans, self.sliding_layers)
        step.gathered_bytes = offset * self.kv_bytes_per_token()
        started = time.thread_time_ns()
        with self.paged.active(step):
            out = self.model(
                input_ids=torch.tensor([ids], dtype=torch.long, device=self.device),
                position_ids=torch.tensor([positions], dtype=torch.long, device=self.device),
                use_cache=False,
                logits_to_keep=0 if need_logits else 1,
            )
        self.forward_cpu_ns += time.thread_time_ns() - started
        if len(step.layers_seen) != len(self.layer_types):
            raise RuntimeError(f"the model ran the paged attention in {len(step.layers_seen)} of {len(self.layer_types)} layers")
        self.last_step = step
        for kv, tokens in rows:
            kv.length += len(tokens)
        if not need_logits:
            return None
        logits = out.logits[0].float().cpu()
        self.last_logits = logits
        return [logits[plan.start : plan.end] for plan in plans]

    def _packed_matches_plain(self) -> bool:
        """Runs two short rows packed and each through the model's own forward (no cache):
        False when the model does not take the packed path (its logits differ, or it refuses).
        Contexts cross a small window. Runs on the serving device and dtype."""
        contexts, news = check_rows(self)
        rows = []
        try:
            with torch.inference_mode():
                for context in contexts:
                    kv = PagedKV(self.pool)
                    self._forward_packed([(kv, context)], [None], need_logits=False)
                    rows.append(kv)
                packed = self._forward_packed(list(zip(rows, news)), [None, None])
                assert packed is not None
                plain = [self.model(input_ids=torch.tensor([c + n], device=self.device)).logits[0, -len(n):].float().cpu()
                         for c, n in zip(contexts, news)]
        except Exception as exc:  # noqa: BLE001 — any refusal means: do not batch this model
            log.warning("the packed forward failed its check: %r", exc)
            return False
        finally:
            for kv in rows:
                kv.release()
        return same_logits(self, packed, plain)

    def kv_bytes_per_token(self) -> int:
        cfg = self.model.config.get_text_config(decoder=True)
        heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return 2 * cfg.num_hidden_layers * heads * head_dim * torch.finfo(self.dtype).bits // 8

    def describe(self) -> dict:
        return {
            "model": str(Path(self.config.model).resolve()),
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "vocab_size": self.vocab_size,
            "max_context": self.max_context,
            "params": self.params,
            "load_s": round(self.load_s, 2),
            "batch_path": self.path,
        }
