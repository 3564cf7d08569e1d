"""``edgespec make-draft`` on any chat target: its chat format read from the target's own files,
the frozen evaluation set and the contamination check, the device choice, resumable stages."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO, ensure_real_target
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from edgespec.cloud.training.chat_format import NoChatTemplate, chat_format
from edgespec.cloud.training.chat_requests import chat_requests
from edgespec.cloud.training.device import choose_device
from edgespec.cloud.training.eval_set import FROZEN_SHA256, contamination, load_eval_set, sha256_of, user_texts
from edgespec.cloud.training.instructions import chat_instructions
from edgespec.cloud.training.make_draft import MakeDraftConfig
from edgespec.cloud.training.target_replies import chunks, run_in_chunks

EVAL_SET = REPO / "prompts" / "chat-eval.jsonl"
# A template no family list knows: its turns end with "</turn>", its documents with "<stop>".
OTHER_TEMPLATE = ("{% for m in messages %}<turn> {{ m['role'] }} {{ m['content'] }} </turn>{% endfor %}"
                  "{% if add_generation_prompt %}<turn> assistant {% endif %}")


def other_chat_model(directory: Path, template: str | None = OTHER_TEMPLATE) -> Path:
    """A tokenizer (and a config) of a chat model unlike SmolLM2: other markers, other ids."""
    words = ["<unk>", "<stop>", "<turn>", "</turn>", "user", "assistant", "hello", "there", "SENTINEL-REPLY-7f3a"]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", eos_token="<stop>",
                                   additional_special_tokens=["<turn>", "</turn>"])
    if template is not None:
        fast.chat_template = template
    fast.save_pretrained(str(directory))
    (directory / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 4, "vocab_size": len(words)}))
    return directory


# ---- the chat format ------------------------------------------------------------------------


def test_the_real_targets_format_comes_from_its_files():
    target = ensure_real_target()
    tokenizer = AutoTokenizer.from_pretrained(target)
    form = chat_format(target, tokenizer)
    assert form.end_of_turn == tokenizer.convert_tokens_to_ids("<|im_end|>")  # found by rendering the template
    assert set(form.stop_ids) == {tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")}
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    text = tokenizer.decode(form.ids(tokenizer, conversation))
    assert text.endswith("<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n") and "hello<|im_end|>" in text


def test_another_template_gives_its_own_end_of_turn(tmp_path):
    directory = other_chat_model(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    form = chat_format(directory, tokenizer)
    end_of_turn, stop = tokenizer.convert_tokens_to_ids("</turn>"), tokenizer.convert_tokens_to_ids("<stop>")
    assert form.end_of_turn == end_of_turn and set(form.stop_ids) == {stop, end_of_turn}
    assert tokenizer.convert_ids_to_tokens(form.ids(tokenizer, "hello there")) == [
        "<turn>", "user", "hello", "there", "</turn>", "<turn>", "assistant"]


def test_a_target_without_a_chat_template_is_refused_with_what_to_pass(tmp_path, capsys):
    directory = other_chat_model(tmp_path / "model", template=None)
    with pytest.raises(NoChatTemplate, match="--chat-template FILE"):
        chat_format(directory)
    template = tmp_path / "template.jinja"
    template.write_text(OTHER_TEMPLATE)
    assert chat_format(directory, template_file=template).end_of_turn == 3  # "</turn>"

    from edgespec.cli import make_draft as cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert cli.run(parser.parse_args(["--target", str(directory), "--out", str(tmp_path / "run")])) == 2
    assert "has no chat template" in capsys.readouterr().err


def test_the_drafts_layers_are_checked_against_the_targets(tmp_path):
    directory = other_chat_model(tmp_path)
    assert MakeDraftConfig(target=directory, draft_layers=2).draft_layer_indices == (0, 1)
    with pytest.raises(ValueError, match="has 4 decoder layers"):
        MakeDraftConfig(target=directory, draft_layers=5)


# ---- the evaluation set -------------------------------------------------------------------


def test_the_evaluation_set_is_frozen_and_covers_what_users_send(tmp_path):
    rows = load_eval_set(EVAL_SET)
    assert sha256_of(EVAL_SET) == FROZEN_SHA256 and len(rows) == 40
    assert {r["kind"] for r in rows} >= {"writing", "roleplay", "reasoning", "extraction", "translation", "summarization",
                                          "open", "maths", "code", "multi-turn"}
    assert sum(len(r["messages"]) > 1 for r in rows) >= 5
    changed = tmp_path / "chat-eval.jsonl"
    changed.write_text(EVAL_SET.read_text().replace("grandma", "grandpa"))
    with pytest.raises(ValueError, match="changed after it was frozen"):
        load_eval_set(changed)
    own = tmp_path / "mine.jsonl"  # another set is frozen by the first run that reads it
    shutil.copyfile(EVAL_SET, own)
    load_eval_set(own, tmp_path / "run")
    own.write_text(own.read_text().replace("grandma", "grandpa"))
    with pytest.raises(ValueError, match="changed after it was frozen"):
        load_eval_set(own, tmp_path / "run")


def test_contamination_finds_an_evaluation_prompt_inside_the_training_text():
    rows = load_eval_set(EVAL_SET)
    clean = [t for i in chat_requests(2000) + chat_instructions("train") for t in user_texts(i.messages)]
    assert contamination(rows, clean) == []  # the generators never wrote an evaluation request
    whole = user_texts(rows[3]["messages"])[0]
    words = user_texts(rows[20]["messages"])[0].split()
    assert contamination(rows, clean + [f"Please help.  {whole.upper()}"]) == [rows[3]["id"]]
    assert contamination(rows, clean + ["so: " + " ".join(words[2:10]) + " and more"]) == [rows[20]["id"]]
    assert contamination(rows, clean + [" ".join(words[2:9])]) == []  # seven words in common is chance


def test_composed_requests_are_varied_and_the_same_for_a_seed():
    requests = chat_requests(600, seed=3)
    assert requests == chat_requests(600, seed=3) and requests != chat_requests(600, seed=4)
    assert len({r.text for r in requests}) > 500
    kinds = {r.kind for r in requests}
    assert kinds == {"writing", "roleplay", "reasoning", "extraction", "translation", "summarization", "open", "maths",
                     "code", "multi-turn"}
    turns = [r for r in requests if r.history]
    assert turns and all(r.messages[-2]["role"] == "assistant" and r.messages[-1]["content"] == r.text for r in turns)


# ---- the device ---------------------------------------------------------------------------


def test_a_gpu_trains_in_bfloat16_and_the_cpu_as_asked():
    import torch

    gpu = choose_device(cuda_available=True, cuda_bf16=True)
    assert gpu.type == "cuda" and gpu.autocast is torch.bfloat16 and "bfloat16 autocast" in gpu.describe()
    assert choose_device(cuda_available=True, cuda_bf16=False).autocast is None  # no fp16 without loss scaling
    assert choose_device("cpu", cuda_available=True).type == "cpu"
    cpu = choose_device(cuda_available=False)
    assert cpu.type == "cpu" and cpu.autocast is torch.bfloat16
    assert choose_device(cuda_available=False, bf16=False).describe() == "CPU (cpu), float32"
    with pytest.raises(ValueError, match="no GPU"):
        choose_device("cuda", cuda_available=False)
    assert choose_device().type == ("cuda" if torch.cuda.is_available() else "cpu")


# ---- resuming a stage ---------------------------------------------------------------------


def test_a_stopped_replies_stage_resumes_without_redoing_an_item(tmp_path):
    items = [(f"i{n}", f"instruction {n}") for n in range(10)]
    made: list[str] = []

    def make_chunk(batch, path, fail_after=None):
        if fail_after is not None and len(chunks(tmp_path)) == fail_after:
            (tmp_path / "chunk-99999.tmp.npz").write_bytes(b"half-written")  # killed mid-write
            raise KeyboardInterrupt
        made.extend(i for i, _ in batch)
        np.savez(path, instruction_ids=np.asarray([i for i, _ in batch]))
        return len(batch)

    with pytest.raises(KeyboardInterrupt):
        run_in_chunks(items, tmp_path, 3, lambda b, p: make_chunk(b, p, fail_after=2), log=lambda _: None)
    assert made == [f"i{n}" for n in range(6)] and len(chunks(tmp_path)) == 2
    result = run_in_chunks(items, tmp_path, 3, make_chunk, log=lambda _: None)
    assert made == [f"i{n}" for n in range(10)]  # each once
    assert result["started_at_reply"] == 6 and result["chunks"] == 4
    assert run_in_chunks(items, tmp_path, 3, make_chunk, log=lambda _: None)["tokens_this_run"] == 0
