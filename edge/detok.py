"""Incremental detokenisation: text for the tokens committed so far, emitted in pieces.

A token can end in the middle of a UTF-8 character (byte-level BPE) or change how the text
before it decodes (SentencePiece spaces), so each push decodes the generated ids and emits
only the new, complete suffix; an incomplete character (U+FFFD at the end) waits for the next push.

Special tokens (``<|im_end|>``, ``<|endoftext|>``, ``<end_of_turn>``: every added token the
tokenizer marks special) never reach the text: a generation that ends at one has its id in
``token_ids`` and nothing of it in the text, streamed or not.
"""

from __future__ import annotations

from tokenizers import Tokenizer

REPLACEMENT = "\ufffd"


class IncrementalDecoder:
    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.emitted = 0  # characters already handed out

    def push(self, token_ids: list[int]) -> str:
        self.ids.extend(token_ids)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith(REPLACEMENT):
            return ""
        piece = text[self.emitted :]
        self.emitted = len(text)
        return piece

    def flush(self) -> str:
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        piece = text[self.emitted :]
        self.emitted = len(text)
        return piece

    @property
    def text(self) -> str:
        return self.tokenizer.decode(self.ids, skip_special_tokens=True)
