"""One training instruction of ``edgespec make-draft``: a user's message, after any earlier turns."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Instruction:
    id: str
    kind: str  # "chat", "code", or a kind of task of chat_requests.py
    text: str  # the user's (last) message
    history: tuple[dict, ...] = ()  # earlier turns of a conversation, as chat messages

    @property
    def messages(self) -> list[dict]:
        return [*self.history, {"role": "user", "content": self.text}]

    def to_json(self) -> dict:
        return {"id": self.id, "kind": self.kind, "prompt": self.text, "messages": self.messages}
