"""``edgespec export-draft``: ONNX vs torch parity for Llama- and GPT-2-style models, the
directory it writes, and that a failed export leaves nothing behind."""

from __future__ import annotations

import argparse

import numpy as np
import onnxruntime as ort
import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.utils import logging as hf_logging

from edgespec.cli import export_draft as export_cli
from edgespec.cloud.training import export
from edgespec.cloud.training.tiny import build_tiny_gpt2, build_tiny_pair
from edgespec.edge.draft import DraftModel
from edgespec.edge.manifest import DraftManifest
from edgespec.edge.tokenizer import fingerprint, load_tokenizer

pytestmark = pytest.mark.slow  # exports or loads models

torch.set_num_threads(1)
hf_logging.disable_progress_bar()
STEPS = 24
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """{name: (hf_dir, ExportReport)} for a 1-layer Llama draft and a 2-layer GPT-2."""
    root = tmp_path_factory.mktemp("export")
    sources = {"llama": build_tiny_pair(root / "pair").draft_dir, "gpt2": build_tiny_gpt2(root / "gpt2")}
    return {name: (src, export.export_draft(src, root / f"{name}-onnx", log=lambda _: None)) for name, src in sources.items()}


def _session(path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _torch_greedy(model, prompt: list[int], steps: int) -> tuple[list[int], list[np.ndarray]]:
    """Greedy decode with the model's own cache: (generated tokens, last-position logits per step)."""
    cache, chunk, tokens, logits = DynamicCache(), prompt, [], []
    with torch.no_grad():
        for _ in range(steps):
            out = model(input_ids=torch.tensor([chunk]), cache=cache, use_cache=True)
            cache = out.cache
            logits.append(out.logits[0, -1].numpy())
            chunk = [int(logits[-1].argmax())]
            tokens.append(chunk[0])
    return tokens, logits


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_export_reports_parity_and_writes_a_complete_directory(exported, name):
    src, report = exported[name]
    assert report.parity.greedy_match and report.parity.max_abs_diff <= TOLERANCE
    assert report.parity.steps >= 20
    side = [n for n in export.TOKENIZER_SIDE_FILES if (src / n).is_file()]
    assert "generation_config.json" in side and "tokenizer_config.json" in side
    assert sorted(p.name for p in report.out_dir.iterdir()) == sorted(["manifest.json", "model.onnx", "tokenizer.json", *side])
    for name in side:  # carried as they are: chat template, special tokens, end tokens
        assert (report.out_dir / name).read_bytes() == (src / name).read_bytes()
    assert not [p for p in report.out_dir.parent.iterdir() if p.name.startswith(".")]  # no staging left
    manifest = DraftManifest.load(report.out_dir)
    assert manifest == report.manifest
    config = AutoModelForCausalLM.from_pretrained(src).config
    assert manifest.architecture == config.architectures[0]
    assert (manifest.num_layers, manifest.vocab_size, manifest.max_positions) == (config.num_hidden_layers, config.vocab_size, 512)
    assert manifest.head_dim == 16 and manifest.eos_token_ids == [0]
    assert manifest.tokenizer_fingerprint == fingerprint(load_tokenizer(src))
    assert manifest.parity_max_abs_diff == report.parity.max_abs_diff
    assert 0 <= report.parity.max_rel_diff <= TOLERANCE and 0 <= report.parity.max_prob_diff <= 1e-3
    assert manifest.parity == {"max_rel_diff": report.parity.max_rel_diff, "max_prob_diff": report.parity.max_prob_diff}
    assert manifest.onnx_sha256 == export.sha256_file(report.out_dir / "model.onnx") and manifest.external_data == {}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_graph_has_dynamic_token_and_past_axes(exported, name):
    _, report = exported[name]
    session = _session(report.onnx_path)
    inputs = {i.name: i.shape for i in session.get_inputs()}
    outputs = {o.name: o.shape for o in session.get_outputs()}
    assert [i.name for i in session.get_inputs()] == report.manifest.input_names
    assert [o.name for o in session.get_outputs()] == report.manifest.output_names
    assert isinstance(inputs["input_ids"][1], str) and isinstance(inputs["past_key_values.0.key"][2], str)
    assert outputs["logits"][2] == report.manifest.vocab_size and isinstance(outputs["present.0.value"][2], str)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_onnx_matches_torch_over_cached_greedy_steps(exported, name):
    """Independent of the exporter's own check: a plain ORT loop from an empty past, fed its
    OWN greedy tokens, against torch's cached greedy decode."""
    src, report = exported[name]
    model = AutoModelForCausalLM.from_pretrained(src).eval()
    m = report.manifest
    prompt = load_tokenizer(src).encode("class Parser:\n    def").ids
    expected_tokens, expected_logits = _torch_greedy(model, prompt, STEPS)

    session = _session(report.onnx_path)
    past = [np.zeros((1, m.num_kv_heads, 0, m.head_dim), np.float32)] * len(m.past_inputs)
    chunk, start, tokens, max_diff = prompt, 0, [], 0.0
    for step in range(STEPS):
        feeds = {"input_ids": np.array([chunk]), "position_ids": np.arange(start, start + len(chunk))[None]}
        logits, *past = session.run(None, {**feeds, **dict(zip(m.past_inputs, past))})
        assert logits.shape == (1, len(chunk), m.vocab_size) and past[0].shape[2] == start + len(chunk)
        max_diff = max(max_diff, float(np.abs(logits[0, -1] - expected_logits[step]).max()))
        start += len(chunk)
        chunk = [int(logits[0, -1].argmax())]
        tokens.append(chunk[0])
    assert tokens == expected_tokens
    assert max_diff <= TOLERANCE

    # The device path: one propose of STEPS drafts is STEPS cached forwards.
    draft = DraftModel(report.out_dir)
    draft.reset(prompt)
    assert draft.propose(STEPS).tokens == expected_tokens
    with torch.no_grad():
        full = model(input_ids=torch.tensor([prompt + expected_tokens])).logits[0].numpy()
    np.testing.assert_allclose(draft.logits_for_context(prompt + expected_tokens), full, atol=TOLERANCE, rtol=0)


@pytest.mark.slow
def test_failed_parity_exits_nonzero_and_leaves_no_directory(exported, tmp_path, capsys):
    src, _ = exported["gpt2"]
    parser = argparse.ArgumentParser()
    export_cli.add_arguments(parser)
    out = tmp_path / "never"
    # The legacy exporter here also covers that path; any real export misses 1e-12.
    args = parser.parse_args(["--model", str(src), "--out", str(out), "--tolerance", "1e-12", "--exporter", "legacy"])
    assert export_cli.run(args) == 1
    captured = capsys.readouterr()
    assert "[3/5] parity check" in captured.out and "FAILED" in captured.out
    assert "disagrees with torch" in captured.err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_existing_output_needs_overwrite(exported, tmp_path):
    src, _ = exported["gpt2"]
    out = tmp_path / "draft"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    with pytest.raises(export.ExportError, match="already exists"):
        export.export_draft(src, out, exporter="legacy", log=lambda _: None)
    report = export.export_draft(src, out, exporter="legacy", overwrite=True, parity_steps=20, log=lambda _: None)
    assert report.parity.greedy_match
    assert {"manifest.json", "model.onnx", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    assert [p.name for p in tmp_path.iterdir()] == ["draft"]


def test_bad_inputs_are_refused_with_clear_errors(tmp_path):
    with pytest.raises(export.ExportError, match="config.json"):
        export.load_source_model(tmp_path)
    with pytest.raises(ValueError, match="exporter"):
        export.ExportConfig(exporter="optimum")
    with pytest.raises(ValueError, match="parity_steps"):
        export.ExportConfig(parity_steps=0)


def test_a_family_that_does_not_export_is_named_in_one_line(exported, tmp_path, monkeypatch):
    src, _ = exported["gpt2"]

    def fails(*args, **kwargs):
        raise RuntimeError("no ONNX function for transformers.grouped_mm_fallback\n" + "graph line\n" * 430)

    monkeypatch.setattr(export.torch.onnx, "export", fails)
    with pytest.raises(export.ExportError) as caught:
        export.export_draft(src, tmp_path / "out", log=lambda _: None)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("gpt2 (GPT2LMHeadModel) does not export")
    assert "grouped_mm_fallback" in message and "--exporter legacy" in message and "llama" in message
    assert not (tmp_path / "out").exists()
