"""Token sources for training loops: one flat array of ids, documents joined by EOS.

``load_token_source`` reads any of the formats ``edgespec distill --data`` accepts:

- a ``.bin`` file of uint16 token ids (what ``edgespec train-demo`` writes; no re-tokenizing);
- a ``.jsonl`` file whose lines are objects with a ``"text"`` field;
- a directory: every ``.txt`` and ``.py`` file under it, sorted by path;
- any other file: read as one UTF-8 text document.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from tqdm import tqdm

TEXT_SUFFIXES = (".txt", ".py")


def _texts(path: Path) -> list[str]:
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)
        if not files:
            raise ValueError(f"{path}: no {'/'.join(TEXT_SUFFIXES)} files under this directory")
        return [p.read_text(encoding="utf-8", errors="replace") for p in files]
    if path.suffix == ".jsonl":
        texts = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                raise ValueError(f"{path}:{n}: each JSONL line must be an object with a string 'text' field")
            texts.append(row["text"])
        return texts
    return [path.read_text(encoding="utf-8")]


def load_token_source(path: str | Path, tokenizer: Tokenizer, eos_id: int | None, vocab_size: int) -> "TokenStream":
    """Tokenizes (or reads) ``path`` into a :class:`TokenStream`; ids must be < ``vocab_size``."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist (expected a .bin, .jsonl, text file or directory)")
    if path.suffix == ".bin":
        ids = np.fromfile(path, dtype=np.uint16).astype(np.int64)
    else:
        sep = [] if eos_id is None else [eos_id]
        chunks = [tokenizer.encode(t).ids + sep for t in tqdm(_texts(path), desc=f"tokenize {path.name}", unit="doc", mininterval=5)]
        ids = np.fromiter((i for c in chunks for i in c), dtype=np.int64)
    if ids.size and int(ids.max()) >= vocab_size:
        raise ValueError(f"{path}: token id {int(ids.max())} >= the models' vocab size {vocab_size}; wrong tokenizer?")
    return TokenStream(ids, name=str(path))


class TokenStream:
    """A flat array of token ids read as random training windows or fixed evaluation windows."""

    def __init__(self, ids: np.ndarray, name: str = "tokens") -> None:
        self.ids = ids
        self.name = name

    @classmethod
    def from_bin(cls, path: str | Path) -> "TokenStream":
        return cls(np.fromfile(path, dtype=np.uint16), name=str(path))

    def __len__(self) -> int:
        return int(self.ids.size)

    def split_tail(self, fraction: float) -> tuple["TokenStream", "TokenStream"]:
        """(head, tail) with the last ``fraction`` of tokens in the tail."""
        cut = int(self.ids.size * (1.0 - fraction))
        return TokenStream(self.ids[:cut], self.name + "[head]"), TokenStream(self.ids[cut:], self.name + "[tail]")

    def _check(self, length: int) -> int:
        span = self.ids.size - length
        if span <= 0:
            raise ValueError(f"{self.name} has {self.ids.size} tokens, fewer than a window of {length}")
        return span

    def random_windows(self, batch_size: int, length: int, generator: torch.Generator) -> torch.Tensor:
        """[batch_size, length] windows at uniformly random offsets."""
        span = self._check(length)
        starts = torch.randint(0, span, (batch_size,), generator=generator).tolist()
        return torch.from_numpy(np.stack([self.ids[s : s + length] for s in starts]).astype(np.int64))

    def fixed_windows(self, count: int, length: int) -> torch.Tensor:
        """[count, length] windows spread evenly over the stream: the same every call."""
        span = self._check(length)
        count = min(count, span // length + 1)
        starts = np.linspace(0, span, num=count).astype(np.int64)
        return torch.from_numpy(np.stack([self.ids[s : s + length] for s in starts]).astype(np.int64))
