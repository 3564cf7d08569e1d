"""How a chat target formats a conversation and ends its turn, read from its own files.

``edgespec make-draft`` distils a draft on the target's replies, so it must prompt the target
exactly as a user's request reaches it and stop each reply where the target ends its turn.
Both come from the target directory, never from a model family's name:

- the chat template: ``chat_template.jinja`` or ``tokenizer_config.json`` (``edge.eos``), or a
  Jinja file the user passes (``--chat-template``) for a target that ships none;
- the end-of-turn token: the first special token the template writes after an assistant
  message (rendered with a sentinel reply), so a family whose marker no list knows still stops;
- the end tokens: ``edge.eos.eos_token_ids`` (generation_config, config, the tokenizer's eos,
  the known end markers), plus the end-of-turn token.

A reply the target writes ends with one of ``stop_ids``; the draft learns to propose it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgespec.edge.eos import chat_template_of, eos_token_ids

SENTINEL = "SENTINEL-REPLY-7f3a"  # text no template writes on its own


class NoChatTemplate(ValueError):
    """The target has no chat template, and none was passed."""


@dataclass(frozen=True)
class ChatFormat:
    template: str
    end_of_turn: int | None  # the special token after an assistant message (None: the template writes none)
    stop_ids: tuple[int, ...]  # every id that ends a reply, the end tokens first

    def ids(self, tokenizer, messages: str | list[dict]) -> list[int]:
        """The prompt of a conversation (a user message, or a list of messages ending with the
        user's), with the assistant's turn opened."""
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        encoded = tokenizer.apply_chat_template(messages, chat_template=self.template, add_generation_prompt=True,
                                                tokenize=True)
        if isinstance(encoded, dict) or hasattr(encoded, "input_ids"):
            encoded = encoded["input_ids"]
        return [int(i) for i in encoded]


def end_of_turn_id(tokenizer, template: str) -> int | None:
    """The first special token the template writes after an assistant message's text."""
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": SENTINEL}],
            chat_template=template, tokenize=False)
    except Exception:  # NOTE: templates raise on shapes they reject (jinja's raise_exception); then none is known
        return None
    if not isinstance(text, str) or SENTINEL not in text:
        return None
    tail = text.split(SENTINEL, 1)[1]
    special = set(tokenizer.all_special_ids) | {
        int(i) for i, token in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items() if getattr(token, "special", False)}
    for token in tokenizer(tail, add_special_tokens=False)["input_ids"]:
        if int(token) in special:
            return int(token)
    return None


def chat_format(target_dir: str | Path, tokenizer=None, template_file: str | Path | None = None) -> ChatFormat:
    """The target's chat format (the module docstring's rule); ``NoChatTemplate`` names what to pass."""
    target_dir = Path(target_dir)
    template = Path(template_file).read_text(encoding="utf-8") if template_file is not None else chat_template_of(target_dir)
    if template is None:
        raise NoChatTemplate(
            f"{target_dir} has no chat template (no chat_template.jinja, no chat_template in tokenizer_config.json): "
            "make-draft prompts the target as a chat user does. Pass --chat-template FILE (a Jinja chat template, "
            "e.g. the one of the model's instruct release), or point --target at a chat model")
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(target_dir, local_files_only=True)
    end = end_of_turn_id(tokenizer, template)
    stop = eos_token_ids(target_dir, vocab_size=len(tokenizer))
    if end is not None and end not in stop:
        stop.append(end)
    if not stop:
        raise ValueError(f"{target_dir}: no end token found (generation_config.json, config.json and tokenizer_config.json "
                         "name none, and the chat template writes no special token after a reply): set eos_token_id in "
                         "generation_config.json")
    return ChatFormat(template, end, tuple(stop))
