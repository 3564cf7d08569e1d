"""The real pair shipped in models/smollm2-135m: complete, made for the target `make setup`
imports, and the ONNX draft is the distilled one."""

from __future__ import annotations

import json

from helpers import REPO

import pytest

pytestmark = pytest.mark.slow  # loads models

PAIR = REPO / "models" / "smollm2-135m"
HELD_OUT = REPO / "prompts" / "chat-heldout.jsonl"


@pytest.fixture(scope="module")
def real_target():
    from edgespec.cloud.demo.run import real_target

    return real_target()  # imported by `make setup`; imported here if not


def test_the_draft_is_shipped_complete_with_its_card():
    for path in ("draft/model.onnx", "draft/manifest.json", "draft/tokenizer.json", "draft/generation_config.json",
                 "draft-hf/model.safetensors", "draft-hf/draft_vocab.json", "metrics.json", "README.md"):
        assert (PAIR / path).is_file(), f"models/smollm2-135m/{path} is missing: `make setup` exports draft/, `edgespec make-draft` rebuilds the rest"
    metrics = json.loads((PAIR / "metrics.json").read_text())
    card = (PAIR / "README.md").read_text()
    assert f"{metrics['draft']['params'] / 1e6:.2f}M parameters" in card
    assert metrics["eval"]["onnx"]["int8"]["tau"] >= 1.0


def test_the_draft_was_made_for_the_imported_target(real_target):
    from edgespec.edge.manifest import DraftManifest
    from edgespec.edge.tokenizer import fingerprint, load_tokenizer

    manifest = DraftManifest.load(PAIR / "draft")
    assert manifest.tokenizer_fingerprint == fingerprint(load_tokenizer(real_target))
    assert manifest.vocab_size == json.loads((real_target / "config.json").read_text())["vocab_size"]
    assert set(manifest.eos_token_ids) >= {2}  # <|im_end|> ends a reply


def test_the_onnx_draft_proposes_what_the_distilled_weights_do(real_target):
    import numpy as np
    import torch
    from transformers import AutoTokenizer

    from edgespec.cloud.training.target_replies import chat_ids
    from edgespec.cloud.training.vocab_draft import load_draft
    from edgespec.edge.draft import DraftModel

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(real_target)
    draft, weights = DraftModel(PAIR / "draft", threads=1), load_draft(PAIR / "draft-hf", dtype=torch.float32)
    onnx_guesses, torch_guesses = [], []
    for line in HELD_OUT.read_text().splitlines()[:8]:
        prompt = json.loads(line)["prompt"]
        ids = chat_ids(tokenizer, prompt) + tokenizer("Here are three tips for you:", add_special_tokens=False)["input_ids"]
        onnx_guesses += draft.logits_for_context(ids).argmax(-1).tolist()
        with torch.no_grad():
            torch_guesses += weights(input_ids=torch.tensor([ids])).logits[0].argmax(-1).tolist()
    # int8 weights against the fp16 ones: mostly the same greedy guesses (0.68-0.69 over these 366
    # tokens, 0.51-0.83 on one prompt; another draft's would agree on a few percent), never a token
    # outside the draft vocabulary
    assert float(np.mean(np.array(onnx_guesses) == np.array(torch_guesses))) >= 0.6
    inside = set(json.loads((PAIR / "draft-hf" / "draft_vocab.json").read_text())["draft_to_target"])
    assert set(onnx_guesses) <= inside
