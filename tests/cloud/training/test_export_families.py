"""Drafts of every common family export to ONNX and drive the device SDK: parity with torch,
and the device's greedy drafts equal torch's greedy decoding, past a sliding window where the
family has one (tiny random 2-layer models)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from edgespec.cloud.training import export
from edgespec.cloud.training.tiny import build_tiny_family
from edgespec.edge.draft import DraftModel
from edgespec.edge.manifest import DraftManifest

pytestmark = pytest.mark.slow  # exports models

torch.set_num_threads(1)
WINDOW = 8
FAMILIES = {
    "llama": {}, "qwen2": {}, "qwen3": {}, "gemma": {}, "phi3": {}, "gpt2": {}, "gpt_neox": {}, "opt": {},
    "falcon": {}, "codegen": {}, "bloom": {}, "starcoder2": {},
    "mistral-window": dict(sliding_window=WINDOW),
    "gemma2-window": dict(sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"]),
    "gemma3_text-window": dict(sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"]),
    "mixtral": {},  # mixture of experts
    "qwen2_moe": {},
}
LAYER_ARGS = {"gpt2": "n_layer", "codegen": "n_layer", "bloom": "n_layer"}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def exported(request, tmp_path_factory):
    name = request.param
    family = name.split("-")[0]
    root = tmp_path_factory.mktemp(name)
    source = build_tiny_family(root / "hf", family, **{LAYER_ARGS.get(family, "num_hidden_layers"): 2}, **FAMILIES[name])
    report = export.export_draft(source, root / "onnx", parity_steps=3 * WINDOW, log=lambda _: None)
    return source, report


def test_parity_with_torch(exported):
    source, report = exported
    assert report.parity.greedy_match and report.parity.max_abs_diff <= 1e-4
    manifest = DraftManifest.load(report.out_dir)
    assert manifest.max_positions >= 512  # the config's, or the default for ALiBi (bloom)


def test_device_drafts_equal_torch_greedy_past_the_window(exported):
    source, report = exported
    model = AutoModelForCausalLM.from_pretrained(source).eval()
    prompt = list(range(3, 3 + WINDOW + 2))
    steps = 3 * WINDOW
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):  # uncached: transformers applies any window itself
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    draft = DraftModel(report.out_dir)
    draft.reset(prompt)
    assert draft.propose(steps).tokens == ids[len(prompt):]
    with torch.no_grad():
        full = model(input_ids=torch.tensor([ids])).logits[0].numpy()
    np.testing.assert_allclose(draft.logits_for_context(ids), full, atol=1e-4, rtol=0)
