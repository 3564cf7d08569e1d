"""Chat requests of the kinds users send, composed from hand-written pieces (``chat_requests.json``).

The template generator (``instructions.py``) crosses 16 task templates with subjects: every
request reads alike. This source varies what the template generator cannot: the kind of task
(writing, roleplay, reasoning, extraction, translation, summarization, open questions, maths,
code), how a user opens and how much they ask for (length and style asks), lower-case casual
typing, and conversations continued by a follow-up (earlier turns written by hand). A request is
drawn from the pieces by a seeded ``random.Random``, so a seed gives the same list on every
machine; the evaluation set (``eval_set.py``) is written apart from these pieces.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from edgespec.cloud.training.instruction import Instruction

PIECES = Path(__file__).with_name("chat_requests.json")
MULTI_TURN_SHARE = 0.15  # of requests: a conversation continued by a follow-up


def load_pieces(path: Path = PIECES) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _single(pieces: dict, kind: str, rng: random.Random) -> str:
    spec = pieces["kinds"][kind]
    task = rng.choice(spec["templates"]).replace("{x}", rng.choice(spec["fillers"]))
    text = rng.choice(pieces["openers"]) + task + rng.choice(pieces["lengths"]) + rng.choice(pieces["styles"])
    return text.lower() if rng.random() < pieces["casual_share"] else text


def _conversation(pieces: dict, rng: random.Random) -> tuple[tuple[dict, ...], str]:
    turns = rng.choice(pieces["conversations"])
    history: list[dict] = []
    for user, assistant in turns:
        history += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return tuple(history), rng.choice(pieces["followups"]) + rng.choice(pieces["lengths"]) + rng.choice(pieces["styles"])


def chat_requests(count: int, seed: int = 1, pieces: dict | None = None) -> list[Instruction]:
    """``count`` distinct requests (fewer if the pieces run out), the same for a seed."""
    pieces = pieces or load_pieces()
    rng = random.Random(f"chat-requests:{seed}")
    kinds = sorted(pieces["kinds"])
    seen: set[tuple] = set()
    out: list[Instruction] = []
    for attempt in range(count * 20):
        if len(out) >= count:
            break
        if rng.random() < MULTI_TURN_SHARE:
            history, text = _conversation(pieces, rng)
            kind = "multi-turn"
        else:
            kind = rng.choice(kinds)
            history, text = (), _single(pieces, kind, rng)
        key = (history[-1]["content"] if history else "", text)
        if key in seen:
            continue
        seen.add(key)
        out.append(Instruction(f"request:{seed}:{attempt}", kind, text, history))
    return out
