"""Which token ids end a generation: one rule for the import, the export and the device.

A model directory can name its end tokens in four places, and real models disagree between
them (SmolLM2-135M-Instruct: ``generation_config.json`` says 2, ``<|im_end|>``, while the
model also ends documents with ``<|endoftext|>``, 0; Gemma 3: ``<eos>`` 1 and
``<end_of_turn>`` 106). A generation stops at the first token of the union, in this order:

1. ``generation_config.json``'s ``eos_token_id`` (an id or a list);
2. ``config.json``'s ``eos_token_id`` (or its ``text_config``'s);
3. the tokenizer's eos token (``tokenizer_config.json``'s ``eos_token``, looked up in
   ``tokenizer.json``);
4. only for chat models (a chat template in ``chat_template.jinja`` or
   ``tokenizer_config.json``): every *special* added token of ``tokenizer.json`` whose text is
   a known end-of-text or end-of-turn marker (``END_MARKERS``). A chat model that meets one of
   them has ended its turn, whichever one its configs happened to name.

Ids outside the vocabulary are dropped. No torch, no transformers: the device reads it too.
"""

from __future__ import annotations

import json
from pathlib import Path

# End-of-text and end-of-turn markers of the common chat families (ChatML, Llama 3, Gemma,
# Phi 3, Mistral/Llama 2, gpt-oss). Only special tokens count: a plain-text "</s>" does not.
END_MARKERS = frozenset({
    "<|endoftext|>", "<|im_end|>", "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>", "<|end|>",
    "<end_of_turn>", "<eos>", "</s>", "<|return|>", "<|end_of_turn|>",
})
CHAT_TEMPLATE_FILE = "chat_template.jinja"


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _ids(value) -> list[int]:
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def chat_template_of(model_dir: str | Path) -> str | None:
    """The chat template: ``chat_template.jinja`` (transformers 5) or ``tokenizer_config.json``'s
    ``chat_template`` (a string, or the list of named templates: the "default" one)."""
    model_dir = Path(model_dir)
    jinja = model_dir / CHAT_TEMPLATE_FILE
    if jinja.is_file():
        text = jinja.read_text(encoding="utf-8")
        if text.strip():
            return text
    template = _read_json(model_dir / "tokenizer_config.json").get("chat_template")
    if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) and template.strip() else None


def special_tokens_of(model_dir: str | Path) -> dict[str, int]:
    """Text -> id of every added token ``tokenizer.json`` marks special."""
    spec = _read_json(Path(model_dir) / "tokenizer.json")
    return {t["content"]: int(t["id"]) for t in spec.get("added_tokens") or []
            if isinstance(t, dict) and t.get("special") and isinstance(t.get("content"), str)}


def _token_id(model_dir: Path, text: str) -> int | None:
    spec = _read_json(model_dir / "tokenizer.json")
    for token in spec.get("added_tokens") or []:
        if isinstance(token, dict) and token.get("content") == text:
            return int(token["id"])
    vocab = (spec.get("model") or {}).get("vocab")
    if isinstance(vocab, dict) and isinstance(vocab.get(text), int):
        return vocab[text]
    return None


def eos_token_ids(model_dir: str | Path, vocab_size: int | None = None) -> list[int]:
    """Every id that ends a generation of the model in ``model_dir`` (the module's rule)."""
    model_dir = Path(model_dir)
    found: list[int] = []
    found += _ids(_read_json(model_dir / "generation_config.json").get("eos_token_id"))
    config = _read_json(model_dir / "config.json")
    found += _ids(config.get("eos_token_id"))
    if isinstance(config.get("text_config"), dict):
        found += _ids(config["text_config"].get("eos_token_id"))
    eos = _read_json(model_dir / "tokenizer_config.json").get("eos_token")
    if isinstance(eos, dict):  # older files spell an AddedToken out
        eos = eos.get("content")
    if isinstance(eos, str) and (token := _token_id(model_dir, eos)) is not None:
        found.append(token)
    if chat_template_of(model_dir) is not None:
        found += sorted(i for text, i in special_tokens_of(model_dir).items() if text in END_MARKERS)
    ordered: list[int] = []
    for token in found:
        if token not in ordered and token >= 0 and (vocab_size is None or token < vocab_size):
            ordered.append(token)
    return ordered
