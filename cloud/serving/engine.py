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

Sliding-window attention (Mistral, Phi-3, StarCoder2, Qwen2 with use_sliding_window, Gemma
2/3 on their sliding layers) keeps a plain full-length cache per layer and applies the window in
the attention mask instead of in a rolling cache: a rolling cache cannot be cropped once the
window is reached (rejected drafts could not fall off the end), and it cannot be right-aligned
into a padded batch. In the padded forward a key at position p_k is visible to a query at
position p_q on a sliding layer only when p_q - p_k < window (transformers' own rule); models
with layer types get one mask per type, models whose every layer slides get the windowed mask.
The price is memory: a sliding layer holds the whole context, as a full layer does (which is
what ``kv_bytes_per_token`` and the admission budget count). A model whose cache layers are of
any other kind (chunked, linear or shared attention) keeps its own cache and is verified one
session at a time; so is one whose padded forward does not match its rows alone in the check
run at load.

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
from transformers.cache_utils import DynamicLayer, get_layer_types_and_kwargs

from edgespec.cloud.serving.config import DEFAULT_MAX_CONTEXT, VerifierConfig
from edgespec.edge.tokenizer import fingerprint, load_tokenizer

log = logging.getLogger(__name__)

PREFILL_CHUNK = 256
PLAIN_LAYER_TYPES = ("full_attention", "sliding_attention")  # layers a plain DynamicLayer serves


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
        self.max_context = config.max_context or model_limit or DEFAULT_MAX_CONTEXT
        self.layer_types, _ = get_layer_types_and_kwargs(model_config)
        self.plain_cache = all(kind in PLAIN_LAYER_TYPES for kind in self.layer_types)
        sliding = "sliding_attention" in self.layer_types
        self.window = int(model_config.sliding_window) if sliding and getattr(model_config, "sliding_window", None) else None
        # Models that name their layer types take one mask per type; the others use one mask
        # for every layer (the windowed one when their config has a window).
        self.mask_per_type = getattr(model_config, "layer_types", None) is not None
        self.can_batch = self.plain_cache
        if not self.plain_cache:
            kinds = sorted(set(self.layer_types) - set(PLAIN_LAYER_TYPES))
            log.warning("model %s has %s cache layers: verifying sessions one at a time", config.model_id, kinds)
        elif not self._padded_matches_alone():
            self.can_batch = False
            log.warning("model %s: a padded batch does not match its rows alone: verifying sessions one at a time",
                        config.model_id)

    def new_kv(self) -> SessionKV:
        return SessionKV(self._new_cache())

    def _new_cache(self) -> DynamicCache:
        if not self.plain_cache:
            return DynamicCache(config=self.model.config)
        cache = DynamicCache()  # full-length layers; the window (if any) is in the mask
        cache.layers.extend(DynamicLayer() for _ in self.layer_types)
        return cache

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
        cache = self._stack_caches([kv for kv, _ in rows], lmax)
        out = self.model(
            input_ids=input_ids.to(self.device),
            position_ids=positions.to(self.device),
            attention_mask=self._masks(visible, positions, lengths, lmax),
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

    def _masks(self, visible: torch.Tensor, positions: torch.Tensor, lengths: list[int], lmax: int):
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

    def _padded_matches_alone(self) -> bool:
        """Runs two short rows padded and each alone: False when the model does not take our
        masks (its logits differ, or it refuses them). Contexts cross a small window."""
        span = self.window + 3 if self.window and self.window <= 64 else 6
        span = min(span, self.max_context - 4)
        generator = torch.Generator().manual_seed(0)
        contexts = [torch.randint(1, self.vocab_size, (n,), generator=generator).tolist() for n in (span, 2)]
        news = [[1, 2, 3], [4, 5]]
        try:
            with torch.inference_mode():
                rows = []
                for context in contexts:
                    kv = self.new_kv()
                    self.prefill(kv, context)
                    rows.append(kv)
                padded = self._forward_padded(list(zip(rows, news)), [None, None])
                for kv, context in zip(rows, contexts):
                    self.trim(kv, len(context))
                alone = [self._forward_one(kv, new) for kv, new in zip(rows, news)]
        except Exception as exc:  # noqa: BLE001 — any refusal means: do not batch this model
            log.warning("the padded forward failed its check: %r", exc)
            return False
        tolerance = 1e-3 if self.model.dtype == torch.float32 else 5e-2
        for a, b in zip(padded, alone):
            scale = max(1.0, float(b.abs().max()))
            if not torch.isfinite(a).all() or float((a - b).abs().max()) > tolerance * scale:
                return False
        return True

    def _stack_caches(self, kvs: list[SessionKV], lmax: int) -> DynamicCache:
        """Right-aligns each session's cache into one [B, H, lmax, D] cache per layer."""
        cache = self._new_cache()
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
