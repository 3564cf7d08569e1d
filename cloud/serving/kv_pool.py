"""One preallocated KV pool per replica, handed out to sessions in pages.

Terms:
    slot  one token's keys and values in one layer: ``keys[layer][:, slot]`` is [H_kv, D]
    page  ``page_tokens`` consecutive slots; a session owns whole pages, never shares one
    page table  a session's pages in order: its position p lives in slot
                ``pages[p // page_tokens] * page_tokens + p % page_tokens``

Per layer the pool is one tensor ``[H_kv, num_pages * page_tokens, D]`` (keys; values alike),
allocated at the first forward from the shapes the model's attention hands over (layers may
differ in heads or head size). A forward writes each new token's keys once, into its slot;
nothing ever moves a session's cache, and attention reads it in place by slot index
(``paged_attention.py``). Rolling back rejected drafts is ``PagedKV.truncate``: the length
drops and whole pages past it go back to the free list.

A session holds ``ceil(tokens / page_tokens)`` pages: its memory is its tokens, rounded up to
one page. The admission budget (``admission.py``) reserves the same pages at Open, so a
session admitted never finds the pool empty mid-generation; ``allocate`` still refuses
(``PoolExhausted``) rather than share a page.
"""

from __future__ import annotations

import weakref

import torch

PAGE_TOKENS = 16


class PoolExhausted(RuntimeError):
    """No free page left: the session that asked must be refused (RESOURCE_EXHAUSTED)."""


class KVPool:
    """The free list and the per-layer tensors; single-threaded (the model thread)."""

    def __init__(self, *, num_layers: int, num_pages: int, page_tokens: int, dtype: torch.dtype, device: torch.device):
        if num_pages < 1:
            raise ValueError(f"a KV pool needs at least one page, got {num_pages}")
        self.num_layers, self.num_pages, self.page_tokens = num_layers, num_pages, page_tokens
        self.dtype, self.device = dtype, device
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self._free = list(range(num_pages - 1, -1, -1))  # a stack: recently freed pages are reused first

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def layer(self, index: int, heads: int, key_dim: int, value_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``index``'s key and value tensors, allocated on first use."""
        keys, values = self.keys[index], self.values[index]
        if keys is None or values is None or keys.shape[0] != heads or keys.shape[2] != key_dim:
            slots = self.num_pages * self.page_tokens
            keys = torch.empty(heads, slots, key_dim, dtype=self.dtype, device=self.device)
            values = torch.empty(heads, slots, value_dim, dtype=self.dtype, device=self.device)
            self.keys[index], self.values[index] = keys, values
        return keys, values

    def allocate(self, count: int) -> list[int]:
        if count > len(self._free):
            raise PoolExhausted(
                f"KV pool full: {count} more page(s) of {self.page_tokens} tokens needed, {len(self._free)} of "
                f"{self.num_pages} free; lower max_new_tokens, retry later or raise max_kv_bytes"
            )
        return [self._free.pop() for _ in range(count)]

    def release(self, pages: list[int]) -> None:
        self._free.extend(reversed(pages))

    def page_bytes(self) -> int:
        total = 0
        for keys, values in zip(self.keys, self.values):
            if keys is not None and values is not None:
                total += (keys.shape[0] * keys.shape[2] + values.shape[0] * values.shape[2]) * keys.element_size()
        return total * self.page_tokens


class PagedKV:
    """One session's page table and length. Its pages go back to the pool on ``release``
    (and, as a safety net, when the object is garbage collected)."""

    def __init__(self, pool: KVPool):
        self.pool = pool
        self.pages: list[int] = []
        self.length = 0
        self._slots: torch.Tensor | None = None  # slot of every position the pages cover (rebuilt when they change)
        self._finalizer = weakref.finalize(self, pool.release, self.pages)

    def reserve(self, tokens: int) -> None:
        """Owns enough pages for ``tokens`` positions."""
        need = -(-tokens // self.pool.page_tokens) - len(self.pages)
        if need > 0:
            self.pages.extend(self.pool.allocate(need))
            self._slots = None

    def slots(self, start: int, end: int) -> torch.Tensor:
        """Pool slots of positions [start, end) (a CPU tensor); the pages must be reserved."""
        if self._slots is None:
            pages = torch.tensor(self.pages, dtype=torch.long)
            self._slots = (pages[:, None] * self.pool.page_tokens + torch.arange(self.pool.page_tokens)).flatten()
        return self._slots[start:end]

    def truncate(self, length: int) -> None:
        """Keeps the first ``length`` positions; whole pages past them return to the pool."""
        self.length = min(self.length, length)
        keep = -(-self.length // self.pool.page_tokens)
        if keep < len(self.pages):
            freed = self.pages[keep:]
            del self.pages[keep:]
            self.pool.release(freed)
            self._slots = None

    def release(self) -> None:
        self.truncate(0)

    def nbytes(self) -> int:
        return len(self.pages) * self.pool.page_bytes()
