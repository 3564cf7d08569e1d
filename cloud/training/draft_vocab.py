"""Vocab-mapped drafts: a draft whose vocabulary is a subset of the target's.

A draft can keep only the target tokens it needs (a smaller embedding and output layer: for
a 49k-256k target vocabulary the output layer is most of a small draft's work). Its
Hugging Face directory then holds ``draft_vocab.json``::

    {"format": 1, "target_vocab_size": V,
     "draft_to_target": [target id of draft id 0, 1, ..., config.vocab_size - 1],
     "unknown_draft_id": d}

Everything outside the draft speaks target ids: ``to_draft_ids`` maps target ids in (a target
id the draft lacks becomes ``unknown_draft_id``), ``to_target_logits`` scatters the draft's
logits [..., v] back into [..., V], every other entry ``MASKED_LOGIT``: finite, so nothing is
NaN, and so negative that softmax gives exactly 0 in float32 (exp(-1e9 - max) underflows).
The export (``edgespec.cloud.training.export``) bakes the same two steps into the ONNX graph,
so the device sees the usual interface; evaluation code uses this module.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

DRAFT_VOCAB_FILE = "draft_vocab.json"
FORMAT = 1
MASKED_LOGIT = -1e9


@dataclass(frozen=True)
class DraftVocab:
    target_vocab_size: int
    draft_to_target: list[int]  # length = the draft's vocab_size
    unknown_draft_id: int

    def __post_init__(self) -> None:
        v, ids = self.target_vocab_size, self.draft_to_target
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"draft_vocab target_vocab_size must be a positive integer, got {v!r}")
        if not ids:
            raise ValueError("draft_vocab draft_to_target is empty")
        bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < v]
        if bad:
            raise ValueError(f"draft_vocab draft_to_target holds ids outside [0, {v}): {bad[:5]}")
        if len(set(ids)) != len(ids):
            raise ValueError("draft_vocab draft_to_target maps two draft ids to one target id")
        if not isinstance(self.unknown_draft_id, int) or not 0 <= self.unknown_draft_id < len(ids):
            raise ValueError(f"draft_vocab unknown_draft_id must be a draft id in [0, {len(ids)}), got {self.unknown_draft_id!r}")

    @property
    def draft_vocab_size(self) -> int:
        return len(self.draft_to_target)

    def target_to_draft(self) -> torch.Tensor:
        """[V] int64: the draft id of each target id (``unknown_draft_id`` where it has none)."""
        table = torch.full((self.target_vocab_size,), self.unknown_draft_id, dtype=torch.int64)
        table[torch.tensor(self.draft_to_target)] = torch.arange(self.draft_vocab_size)
        return table

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "target_vocab_size": self.target_vocab_size,
                           "draft_to_target": self.draft_to_target, "unknown_draft_id": self.unknown_draft_id}) + "\n"


def load_draft_vocab(model_dir: str | Path) -> DraftVocab | None:
    """The mapping in ``model_dir``, or None for a draft over the target's own vocabulary."""
    path = Path(model_dir) / DRAFT_VOCAB_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path}: format must be {FORMAT}, got {data.get('format') if isinstance(data, dict) else data!r}")
    try:
        return DraftVocab(data["target_vocab_size"], list(data["draft_to_target"]), data["unknown_draft_id"])
    except KeyError as exc:
        raise ValueError(f"{path} lacks {exc.args[0]!r}") from None
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def save_draft_vocab(vocab: DraftVocab, model_dir: str | Path) -> Path:
    path = Path(model_dir) / DRAFT_VOCAB_FILE
    path.write_text(vocab.to_json(), encoding="utf-8")
    return path


def to_draft_ids(target_ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Target ids [...] -> draft ids [...]; ``table`` is ``DraftVocab.target_to_draft()`` [V]."""
    return table[target_ids]  # a gather: exports as one ONNX Gather


def to_target_logits(draft_logits: torch.Tensor, draft_to_target: torch.Tensor, target_vocab_size: int) -> torch.Tensor:
    """Draft logits [..., v] -> target logits [..., V], ``MASKED_LOGIT`` where the draft has no token."""
    shape = (*draft_logits.shape[:-1], target_vocab_size)
    out = torch.full(shape, MASKED_LOGIT, dtype=draft_logits.dtype, device=draft_logits.device)
    index = draft_to_target.to(draft_logits.device).expand(*draft_logits.shape[:-1], -1)
    return out.scatter(-1, index, draft_logits)


class VocabMappedLM(torch.nn.Module):
    """A draft causal LM that takes and returns the target's vocabulary (``forward`` as the
    wrapped model's: ``input_ids`` are target ids, ``logits`` are over V)."""

    def __init__(self, model: torch.nn.Module, vocab: DraftVocab):
        super().__init__()
        self.model, self.vocab = model, vocab
        self.config = model.config
        self.register_buffer("table", vocab.target_to_draft(), persistent=False)
        self.register_buffer("draft_to_target", torch.tensor(vocab.draft_to_target, dtype=torch.int64), persistent=False)

    def forward(self, input_ids: torch.Tensor, **kwargs):
        out = self.model(input_ids=to_draft_ids(input_ids, self.table), **kwargs)
        out.logits = to_target_logits(out.logits, self.draft_to_target, self.vocab.target_vocab_size)
        return out
