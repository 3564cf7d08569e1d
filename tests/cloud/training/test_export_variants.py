"""Export variants: a vocab-mapped draft (draft_vocab.json) keeps the usual graph interface; int8
weights; the target recorded in the manifest; the torch helper of the mapping."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgespec.cloud.training import export
from edgespec.cloud.training.draft_vocab import (
    MASKED_LOGIT, DraftVocab, VocabMappedLM, load_draft_vocab, save_draft_vocab, to_draft_ids, to_target_logits,
)
from edgespec.cloud.training.tiny import build_tiny_pair, tiny_llama_config
from edgespec.edge.draft import DraftModel
from edgespec.edge.tokenizer import fingerprint

pytestmark = pytest.mark.slow

torch.set_num_threads(1)


def test_mapping_helpers_round_trip():
    vocab = DraftVocab(10, [0, 3, 4, 9], 0)
    table = vocab.target_to_draft()
    assert to_draft_ids(torch.tensor([9, 4, 5, 3]), table).tolist() == [3, 2, 0, 1]  # 5 is unknown -> 0
    logits = to_target_logits(torch.tensor([[1.0, 2.0, 3.0, 4.0]]), torch.tensor(vocab.draft_to_target), 10)
    assert logits.shape == (1, 10) and logits[0, 9] == 4.0 and logits[0, 1] == MASKED_LOGIT
    probs = torch.softmax(logits, -1)
    assert torch.isfinite(probs).all() and probs[0, 1] == 0.0  # exactly 0, not NaN
    with pytest.raises(ValueError, match="outside"):
        DraftVocab(10, [0, 10], 0)
    with pytest.raises(ValueError, match="two draft ids"):
        DraftVocab(10, [1, 1], 0)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_tiny_pair(tmp_path_factory.mktemp("variants") / "pair")


def _mapped_draft(pair, root):
    """A random 1-layer Llama over the first half of the target's ids (reversed), plus its mapping."""
    from transformers import AutoConfig, LlamaForCausalLM

    target_vocab = AutoConfig.from_pretrained(str(pair.target_dir)).vocab_size
    keep = list(range(target_vocab // 2))[::-1]
    config = tiny_llama_config(len(keep), layers=1)
    torch.manual_seed(1)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.5)
    out = root / "mapped-hf"
    model.save_pretrained(str(out))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out / name).write_bytes((pair.draft_dir / name).read_bytes())
    save_draft_vocab(DraftVocab(target_vocab, keep, keep.index(0)), out)
    return out, target_vocab


def test_vocab_mapped_draft_keeps_the_interface(pair, tmp_path):
    source, target_vocab = _mapped_draft(pair, tmp_path)
    report = export.export_draft(source, tmp_path / "mapped", target_dir=pair.target_dir, parity_steps=8, log=lambda _: None)
    manifest = report.manifest
    assert manifest.vocab_size == target_vocab and manifest.draft_vocab_size == target_vocab // 2
    assert manifest.target == {"name": pair.target_dir.name, "tokenizer_fingerprint": fingerprint(pair.target_dir)}
    assert report.parity.greedy_match and report.parity.max_prob_diff <= 1e-3
    draft = DraftModel(tmp_path / "mapped")
    ids = [5, target_vocab - 1, 7, 3]  # target_vocab - 1 is outside the draft's vocabulary
    logits = draft.logits_for_context(ids)
    assert logits.shape == (4, target_vocab) and np.isfinite(logits).all()
    assert (logits[:, target_vocab // 2 :] == np.float32(MASKED_LOGIT)).all()
    # the same numbers as the torch helper applied to the draft model itself
    from transformers import AutoModelForCausalLM

    model = VocabMappedLM(AutoModelForCausalLM.from_pretrained(str(source)).eval(), load_draft_vocab(source))
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([ids])).logits[0].numpy()
    real = expected > MASKED_LOGIT / 2
    assert np.abs(logits[real] - expected[real]).max() < 1e-4
    proposal = draft.reset(ids) or draft.propose(4)
    assert all(t < target_vocab // 2 for t in proposal.tokens)  # never drafts a token it lacks


def test_int8_export_keeps_float_graph_on_request(pair, tmp_path):
    report = export.export_draft(pair.draft_dir, tmp_path / "int8", quantize="int8", keep_fp32=True, parity_steps=8,
                                 log=lambda _: None)
    names = {p.name for p in (tmp_path / "int8").iterdir()}
    assert {"model.onnx", export.FLOAT_ONNX_FILE} <= names
    assert report.manifest.quantization == "int8"
    assert 0.0 <= report.manifest.parity["int8"]["greedy_agreement"] <= 1.0
    assert report.manifest.onnx_sha256 == export.sha256_file(tmp_path / "int8" / "model.onnx")
    DraftModel(tmp_path / "int8").logits_for_context([1, 2, 3])
    jsonschema = pytest.importorskip("jsonschema")
    import json

    from helpers import REPO

    schema = json.loads((REPO / "docs" / "manifest.schema.json").read_text())
    jsonschema.validate(json.loads((tmp_path / "int8" / "manifest.json").read_text()), schema)
    plain = export.export_draft(pair.draft_dir, tmp_path / "int8-only", quantize="int8", parity_steps=4, log=lambda _: None)
    assert export.FLOAT_ONNX_FILE not in {p.name for p in plain.out_dir.iterdir()}


def test_a_target_with_another_tokenizer_is_refused(pair, tmp_path):
    from edgespec.cloud.training.tiny import build_tiny_gpt2

    other = build_tiny_gpt2(tmp_path / "other", vocab_size=300)
    with pytest.raises(export.ExportError, match="is not the target's"):
        export.export_draft(pair.draft_dir, tmp_path / "x", target_dir=other, parity_steps=2, log=lambda _: None)


def test_parity_is_judged_against_the_logits_scale():
    rng = np.random.default_rng(0)
    big = (rng.standard_normal((4, 1000)) * 30).astype(np.float32)  # Gemma-like logits, tens wide
    diff = export._Diff()
    diff.add(big + np.float32(2e-3), big)  # 2e-3 absolute: over the old 1e-4, nothing greedy could see
    result = export.ParityResult(diff.max_abs, True, 1, None, diff.max_rel, diff.max_prob)
    assert result.max_abs_diff > 1e-4 and result.passes(1e-4, 1e-3)
    small = (rng.standard_normal((4, 50)) * 0.1).astype(np.float32)
    diff = export._Diff()
    diff.add(small + np.float32(5e-4), small)  # small logits keep the absolute bound (scale floor 1)
    assert diff.max_rel > 1e-4
    masked = np.full((2, 6), MASKED_LOGIT, np.float32)
    masked[:, :3] = 1.0
    broken = masked.copy()
    broken[0, 4] = 0.5  # an entry the draft lacks became a real logit
    diff = export._Diff()
    diff.add(broken, masked)
    assert diff.max_rel == float("inf")


def test_external_data_is_hashed_and_checked(pair, tmp_path, monkeypatch):
    from edgespec.edge.errors import DraftIntegrityError

    monkeypatch.setattr(export, "_EXTERNAL_DATA_BYTES", 0)  # as if the weights passed 1 GiB
    report = export.export_draft(pair.draft_dir, tmp_path / "ext", parity_steps=4, log=lambda _: None)
    assert report.manifest.external_data, "no external-data file written"
    (name, digest), = report.manifest.external_data.items()
    assert export.sha256_file(tmp_path / "ext" / name) == digest
    DraftModel(tmp_path / "ext").logits_for_context([1, 2])
    data = tmp_path / "ext" / name
    raw = bytearray(data.read_bytes())
    raw[-5] ^= 0x10
    data.write_bytes(bytes(raw))
    with pytest.raises(DraftIntegrityError, match=name):
        DraftModel(tmp_path / "ext")
