"""Coupled mode inside vLLM: a logits processor that makes the engine emit the coupled race's token.

Coupled mode (``edge/params.py``, docs/protocol.md "Coupled mode") defines the target's token at
absolute position P as t_P = argmax_v p_P(v) / E_P(v), with exponentials keyed by (seed, P, v):
an exact sample from p_P (after temperature, top-k and top-p), independent of how positions are
split into rounds. ``CoupledRace`` computes exactly that from the row's logits and leaves t_P as
the only finite logit, so the request's greedy sampler picks it. The engine loads it by name
(``engine_args``'s ``logits_processors``); a request asks for it through
``SamplingParams.extra_args[KEY]`` (its sampling parameters), and every other request passes
through untouched.

``VllmBackend`` uses it twice: a coupled round is k + 1 one-token requests (prompt = context +
the first j drafts, j = 0..k) whose tokens are t_P .. t_{P+k}, accepted while they equal the
drafts; and a sampled Generate is one streaming request with the processor on, so its text is
the same function of (seed, prompt, target) as the speculative one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from edgespec.cloud.serving.accept import target_probs
from edgespec.edge.params import SamplingParams
from edgespec.edge.sampling import coupled_token

if TYPE_CHECKING:
    from vllm.config import VllmConfig

KEY = "edgespec_coupled"  # extra_args entry: {"temperature", "top_k", "top_p", "seed"}
FQCN = f"{__name__}:CoupledRace"


class CoupledRace(LogitsProcessor):
    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool):
        # batch row -> (sampling, prompt length, the request's live list of output tokens)
        self.rows: dict[int, tuple[SamplingParams, int, list[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        return False  # it decides greedy requests' tokens

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, params, prompt_ids, output_ids in batch_update.added:
            wanted = (params.extra_args or {}).get(KEY) if params is not None else None
            if wanted:
                self.rows[index] = (SamplingParams(**wanted), len(prompt_ids or ()), output_ids)
            else:
                self.rows.pop(index, None)
        for source, target, direction in batch_update.moved:
            moving = self.rows.pop(source, None)
            if direction is MoveDirectionality.SWAP:
                other = self.rows.pop(target, None)
                if other is not None:
                    self.rows[source] = other
            if moving is not None:
                self.rows[target] = moving

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, (sampling, prompt_len, output_ids) in self.rows.items():
            probs = target_probs(logits[index : index + 1], sampling)[0].double().cpu().numpy()
            token = coupled_token(probs, sampling.resolved_seed, prompt_len + len(output_ids))
            logits[index].fill_(float("-inf"))
            logits[index, token] = 0.0
        return logits


def extra_args(sampling: SamplingParams) -> dict:
    """The ``SamplingParams.extra_args`` that turn ``CoupledRace`` on for a request."""
    return {KEY: {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
                  "seed": sampling.resolved_seed}}
