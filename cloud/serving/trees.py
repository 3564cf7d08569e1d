"""A tree draft's shape: each new token's depth and ancestors, from its parent indices."""

from __future__ import annotations


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
