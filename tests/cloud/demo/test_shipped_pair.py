"""The demo pair shipped in models/demo: complete, consistent, and the ONNX draft is the trained one."""

from __future__ import annotations

import json

from helpers import REPO

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # exports or loads models

PAIR = REPO / "models" / "demo"
HELD_OUT = REPO / "prompts" / "heldout.jsonl"


def held_out_prompt(index: int = 0) -> str:
    return json.loads(HELD_OUT.read_text().splitlines()[index])["prompt"]


def test_the_pair_is_shipped_complete():
    for path in ("target/config.json", "target/model.safetensors", "target/tokenizer.json",
                 "draft/model.onnx", "draft/manifest.json", "draft/tokenizer.json",
                 "draft-hf/model.safetensors", "metrics.json", "README.md"):
        assert (PAIR / path).is_file(), f"models/demo/{path} is missing: `make setup` exports draft/, `edgespec train-demo` rebuilds the rest"
    metrics = json.loads((PAIR / "metrics.json").read_text())
    assert metrics["target"]["dtype"] == "float16"
    # the target must be clearly better than the draft, or the pair shows nothing
    assert metrics["target"]["val_loss"] + 0.5 <= metrics["draft_pretrained"]["val_loss"]


def test_the_shipped_draft_is_the_two_layer_one_and_no_worse_than_the_one_it_replaced():
    from edgespec.cloud.demo.models import DRAFT_SHAPE
    from edgespec.edge.manifest import DraftManifest

    metrics = json.loads((PAIR / "metrics.json").read_text())
    config = json.loads((PAIR / "draft-hf" / "config.json").read_text())
    assert config["num_hidden_layers"] == DRAFT_SHAPE.layers == metrics["draft"]["config"]["num_hidden_layers"]
    assert DraftManifest.load(PAIR / "draft").num_layers == DRAFT_SHAPE.layers  # the ONNX is this draft's export
    assert f"{DRAFT_SHAPE.layers} layers x" in (PAIR / "README.md").read_text()
    shipped = metrics["eval"]["distilled"]
    replaced = (metrics.get("draft_init") or {}).get("history", {}).get("eval")
    if replaced:  # grown from an earlier draft: it must beat it where the device spends its time
        assert shipped["tau"] > replaced["tau"] and shipped["tau_with_lookup"] >= replaced["tau_with_lookup"] - 0.05


def test_target_draft_and_onnx_share_one_tokenizer():
    from edgespec.edge.manifest import DraftManifest
    from edgespec.edge.tokenizer import fingerprint, load_tokenizer

    shipped = json.loads((PAIR / "metrics.json").read_text())["tokenizer_fingerprint"]
    assert fingerprint(load_tokenizer(PAIR / "target")) == shipped
    assert fingerprint(load_tokenizer(PAIR / "draft")) == shipped
    assert DraftManifest.load(PAIR / "draft").tokenizer_fingerprint == shipped


@pytest.mark.slow
def test_onnx_draft_matches_the_torch_draft_and_the_target_runs():
    import torch
    from transformers import AutoModelForCausalLM

    from edgespec.edge.draft import DraftModel
    from edgespec.edge.sampling import SamplingParams
    from edgespec.edge.tokenizer import load_tokenizer

    torch.set_num_threads(1)
    ids = load_tokenizer(PAIR / "draft").encode(held_out_prompt()).ids
    draft = DraftModel(PAIR / "draft", threads=1)
    draft.reset(ids)
    onnx_tokens = draft.propose(8, sampling=SamplingParams()).tokens
    reference = AutoModelForCausalLM.from_pretrained(str(PAIR / "draft-hf"), dtype=torch.float32).eval()
    with torch.no_grad():
        torch_tokens = reference.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)[0, len(ids):].tolist()
        np.testing.assert_allclose(
            draft.logits_for_context(ids)[-1], reference(torch.tensor([ids])).logits[0, -1].numpy(), atol=1e-4, rtol=0
        )
    assert onnx_tokens == torch_tokens
    target = AutoModelForCausalLM.from_pretrained(str(PAIR / "target"), dtype=torch.float32).eval()
    with torch.no_grad():
        out = target.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False)
    assert out.shape[1] == len(ids) + 4
