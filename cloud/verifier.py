"""Verification on one replica, free of any transport: open sessions, verify batches.

``Verifier.step`` is the whole round for a batch of sessions:

1. one target forward over every session's (pending token + drafts);
2. the accept rule per mode (greedy rows together, exact rows together, token rows together);
3. stop tokens / length / context limits applied to each raw verdict;
4. each session's KV cache rolled back to its committed length.

A step with no drafts is a plain decoding step: that is how ``Generate`` (cloud-only
generation, the baseline) shares the same batched forward as speculative sessions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from edgespec.cloud.accept import round_generator, verify_greedy, verify_sampling
from edgespec.cloud.config import VerifierConfig
from edgespec.cloud.engine import TargetEngine
from edgespec.cloud.sampling import target_probs
from edgespec.cloud.session import DraftBlock, Limits, Mode, OpenRequest, SessionState, Verdict, open_session, settle


@dataclass
class VerifyItem:
    state: SessionState
    block: DraftBlock | None  # None: a decoding step with no drafts

    @property
    def drafts(self) -> list[int]:
        return self.block.tokens if self.block else []


class Verifier:
    def __init__(self, config: VerifierConfig):
        self.config = config
        self.engine = TargetEngine(config)
        self.limits = Limits(
            vocab_size=self.engine.vocab_size,
            max_context=self.engine.max_context,
            max_k=config.max_k,
            max_new_tokens=config.max_new_tokens,
            default_max_new_tokens=config.default_max_new_tokens,
            tokenizer_fingerprint=self.engine.tokenizer_fingerprint,
        )

    def start(self, request: OpenRequest, *, generate: bool = False) -> SessionState:
        """Validates the request and prefills the prompt (all but its last token)."""
        state = open_session(request, self.limits, generate=generate)
        state.kv = self.engine.new_kv()
        self.engine.prefill(state.kv, state.committed[:-1])
        return state

    def step(self, items: list[VerifyItem]) -> list[Verdict]:
        started = time.perf_counter()
        # Step 1: one forward for the whole batch.
        rows = [(item.state.kv, [item.state.pending] + item.drafts) for item in items]
        logits = self.engine.forward(rows)
        # Step 2: the accept rule, one call per mode.
        accepted = [0] * len(items)
        next_tokens = [0] * len(items)
        for mode in Mode:
            group = [i for i, item in enumerate(items) if item.state.spec.mode is mode]
            if group:
                counts, tokens = self._accept(mode, [items[i] for i in group], [logits[i] for i in group])
                for i, n, t in zip(group, counts, tokens):
                    accepted[i], next_tokens[i] = n, t
        verify_ms = (time.perf_counter() - started) * 1000.0
        # Steps 3 and 4: limits, then roll every cache back to its committed length.
        verdicts = []
        for item, n, token in zip(items, accepted, next_tokens):
            state = item.state
            round_no = state.next_round
            n, token, finish = settle(state, item.drafts, n, token)
            self.engine.trim(state.kv, len(state.committed) - 1)
            verdict = Verdict(round_no, n, token, finish, batch_size=len(items), verify_ms=verify_ms)
            state.last_block, state.last_verdict = item.block, verdict
            verdicts.append(verdict)
        return verdicts

    def _accept(self, mode: Mode, items: list[VerifyItem], logits: list[torch.Tensor]) -> tuple[list[int], list[int]]:
        batch = len(items)
        max_k = max(len(item.drafts) for item in items)
        vocab = logits[0].shape[-1]
        drafts = torch.zeros(batch, max_k, dtype=torch.long)
        num_drafts = torch.tensor([len(item.drafts) for item in items], dtype=torch.long)
        for b, item in enumerate(items):
            drafts[b, : len(item.drafts)] = torch.tensor(item.drafts, dtype=torch.long)
        if mode is Mode.GREEDY:
            padded = torch.full((batch, max_k + 1, vocab), float("-inf"))
            for b, row in enumerate(logits):
                padded[b, : row.shape[0]] = row
            counts, tokens = verify_greedy(drafts, padded, num_drafts)
            return counts.tolist(), tokens.tolist()
        p = torch.zeros(batch, max_k + 1, vocab)
        q = torch.zeros(batch, max_k, vocab, dtype=torch.float64) if mode is Mode.EXACT else None
        for b, (item, row) in enumerate(zip(items, logits)):
            p[b, : row.shape[0]] = target_probs(row, item.state.spec.sampling)
            if q is not None:
                q[b, : len(item.drafts)] = item.block.q
        generators = [round_generator(item.state.spec.sampling.seed, item.state.next_round) for item in items]
        counts, tokens = verify_sampling(drafts, q, p, num_drafts, generators)
        return counts.tolist(), tokens.tolist()
