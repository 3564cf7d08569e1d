"""The evaluation set a draft is judged on: chat requests written apart from the training instructions.

``prompts/chat-eval.jsonl`` holds 40 requests written by hand, in the way users write them
(writing, roleplay, reasoning, extraction, translation, summarization, open questions, maths,
code; six multi-turn conversations), without looking at the instruction generators. It was
frozen before any draft trained on the new instructions: its sha256 is ``FROZEN_SHA256``, and
``edgespec make-draft`` refuses a file that differs. Another evaluation set (``--eval-set``) is
frozen by its first run: the run directory records its sha256 and refuses a changed file.

A figure on it means something only if no training instruction contains it: ``contamination``
finds every evaluation message that occurs in a training message, or shares a run of
``SHINGLE_WORDS`` words with one (normalised: lower case, single spaces), and ``make-draft``
refuses to train while any is found.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Iterable

FROZEN_NAME = "chat-eval.jsonl"
FROZEN_SHA256 = "f67eef570400bbcee7aaf3405298fcad2bf6ba1a4abb384595cff34aa3f475ac"
SHINGLE_WORDS = 8
RECORD = "eval_set.sha256"  # in the run directory


def sha256_of(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def load_eval_set(path: Path, run_dir: Path | None = None) -> list[dict]:
    """The rows (``id``, ``kind``, ``prompt``, ``messages``), after the freeze check (module docstring)."""
    path = Path(path)
    digest = sha256_of(path)
    record = Path(run_dir) / RECORD if run_dir is not None else None
    expected = FROZEN_SHA256 if path.name == FROZEN_NAME else (
        record.read_text().strip() if record is not None and record.is_file() else digest)
    if digest != expected:
        raise ValueError(f"{path} changed after it was frozen (sha256 {digest}, frozen {expected}): an evaluation set "
                         "is fixed before training; restore it, or evaluate a new set in a new --out")
    if record is not None:
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(digest + "\n")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    for row in rows:
        if not row.get("messages"):
            row["messages"] = [{"role": "user", "content": row["prompt"]}]
    return rows


def _normal(text: str) -> str:
    return re.sub(r"\s+", " ", text.lower()).strip()


def _shingles(text: str) -> set[tuple[str, ...]]:
    words = _normal(text).split(" ")
    return {tuple(words[i : i + SHINGLE_WORDS]) for i in range(len(words) - SHINGLE_WORDS + 1)}


def user_texts(messages: list[dict]) -> list[str]:
    return [m["content"] for m in messages if m.get("role") == "user" and m.get("content")]


def contamination(eval_rows: list[dict], training_texts: Iterable[str]) -> list[str]:
    """The ids of evaluation rows one of whose user messages occurs in a training text or shares
    a ``SHINGLE_WORDS``-word run with one."""
    training = [_normal(t) for t in training_texts]
    joined = "\n".join(training)
    shingles = set().union(*(_shingles(t) for t in training)) if training else set()
    found = []
    for row in eval_rows:
        for text in user_texts(row["messages"]):
            if _normal(text) in joined or _shingles(text) & shingles:
                found.append(row["id"])
                break
    return found
