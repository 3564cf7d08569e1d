"""One end-token rule (edgespec.edge.eos) and the chat template in either file form."""

from __future__ import annotations

import json

from edgespec.edge.eos import chat_template_of, eos_token_ids

TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"


def _dir(tmp_path, *, template_in=None, generation=None, config_eos=None):
    added = [{"id": 0, "content": "<|endoftext|>", "special": True}, {"id": 1, "content": "<|im_start|>", "special": True},
             {"id": 2, "content": "<|im_end|>", "special": True}, {"id": 3, "content": "</s>", "special": False}]
    (tmp_path / "tokenizer.json").write_text(json.dumps({"added_tokens": added, "model": {"type": "BPE", "vocab": {}}}))
    config = {"eos_token": "<|im_end|>"}
    if template_in == "config":
        config["chat_template"] = TEMPLATE
    elif template_in == "jinja":
        (tmp_path / "chat_template.jinja").write_text(TEMPLATE)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    if generation is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": generation}))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": config_eos}))
    return tmp_path


def test_chat_template_found_in_either_form(tmp_path):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir(), (tmp_path / "c").mkdir()
    assert chat_template_of(_dir(tmp_path / "a", template_in="jinja")) == TEMPLATE
    assert chat_template_of(_dir(tmp_path / "b", template_in="config")) == TEMPLATE
    assert chat_template_of(_dir(tmp_path / "c")) is None


def test_chat_models_stop_at_every_end_marker_in_order(tmp_path):
    # generation_config first, then config, the tokenizer's eos, then special end markers
    model = _dir(tmp_path, template_in="jinja", generation=[2], config_eos=2)
    assert eos_token_ids(model) == [2, 0]


def test_a_plain_model_keeps_what_its_files_name(tmp_path):
    model = _dir(tmp_path, generation=5, config_eos=[6, 5])
    assert eos_token_ids(model) == [5, 6, 2]  # no template: <|endoftext|> is not added
    assert eos_token_ids(model, vocab_size=6) == [5, 2]  # ids outside the vocabulary dropped
