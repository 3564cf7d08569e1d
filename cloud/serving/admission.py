"""Admission: whether the replica takes one more session, counted in sessions, KV bytes and keys.

A session holds one of ``max_sessions`` slots and reserves, at Open, the KV cache its whole
generation may need: (prompt + max_new_tokens, at most the max context, + the most new tokens
one round feeds) rounded up to whole pages of the KV pool (``kv_pool.py``) x KV bytes per
token. The budget is the pool's size, so an admitted session never finds the pool empty.
The replica refuses (RESOURCE_EXHAUSTED) a session that would pass either budget, and one over
its API key's quota (``auth.Quotas``), before any model work. Everything taken is given back by
``release``, whatever way the session ends.
"""

from __future__ import annotations

import grpc

from edgespec.cloud.serving.auth import ApiKey, Quotas
from edgespec.cloud.serving.session import SessionState
from edgespec.edge.errors import status_error


class Admission:
    def __init__(self, *, max_sessions: int, max_kv_bytes: int, kv_bytes_per_token: int, page_tokens: int = 1,
                 round_tokens: int = 0):
        self.max_sessions, self.max_kv_bytes, self.kv_bytes_per_token = max_sessions, max_kv_bytes, kv_bytes_per_token
        self.page_tokens, self.round_tokens = page_tokens, round_tokens
        self.active = 0
        self.reserved_bytes = 0
        self.quotas = Quotas()

    def reservation(self, state: SessionState) -> int:
        tokens = min(len(state.committed) + state.max_new_tokens, state.limits.max_context) + self.round_tokens
        pages = -(-tokens // self.page_tokens)
        return pages * self.page_tokens * self.kv_bytes_per_token

    def acquire(self, state: SessionState, key: ApiKey | None) -> None:
        """Takes a slot, the session's KV reservation and its key's share; raises RESOURCE_EXHAUSTED."""
        if self.active >= self.max_sessions:
            raise status_error(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"replica at capacity ({self.max_sessions} sessions): retry later or add replicas (retry after 1s)",
            )
        need = max(self.reservation(state), 1)
        if self.reserved_bytes + need > self.max_kv_bytes:
            raise status_error(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"replica KV cache budget full: this session needs {need} bytes, {self.max_kv_bytes - self.reserved_bytes} "
                f"of {self.max_kv_bytes} are free; lower max_new_tokens or retry later (retry after 1s)",
            )
        self.quotas.acquire(key)
        self.active += 1
        self.reserved_bytes += need
        state.reserved_bytes, state.key = need, key

    def release(self, state: SessionState) -> None:
        if state.reserved_bytes:
            self.active -= 1
            self.reserved_bytes -= state.reserved_bytes
            self.quotas.release(state.key)
            state.reserved_bytes = 0

    @property
    def free_sessions(self) -> int:
        return max(self.max_sessions - self.active, 0)
