"""Distillation (edgespec.cloud.training.distill) and the alignment math it reports (edgespec.cloud.training.alignment)."""

from __future__ import annotations

import argparse
from types import SimpleNamespace
import json
import math
import shutil
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch

from edgespec.cli import distill as distill_cli
from edgespec.cloud.training.alignment import alpha, cross_entropy, greedy_agreement, kl_divergence
from edgespec.cloud.training.continuation import continue_prompts
from edgespec.cloud.training.distill import DistillConfig, check_pair, distill
from edgespec.edge.errors import TokenizerMismatchError
from edgespec.edge.tokenizer import load_tokenizer
from edgespec.cloud.training.tiny import save_tokenizer, train_tokenizer
from transformers import AutoModelForCausalLM

torch.set_num_threads(1)
STDLIB = Path(sysconfig.get_paths()["stdlib"])


def _logits(probs: list[list[float]]) -> torch.Tensor:
    return torch.tensor(probs).log()


# ---- alignment math on hand-built distributions ------------------------------------------


def test_kl_alpha_agreement_on_known_distributions():
    p = _logits([[0.5, 0.5], [0.9, 0.1]])
    q = _logits([[0.9, 0.1], [0.9, 0.1]])
    expected_kl = (0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1) + 0.0) / 2
    assert kl_divergence(p, q).item() == pytest.approx(expected_kl, rel=1e-5)
    assert alpha(p, q).item() == pytest.approx((0.6 + 1.0) / 2, rel=1e-6)
    # row 0 is a tie in p: argmax takes the first index, as does q
    assert greedy_agreement(p, q).item() == 1.0
    assert greedy_agreement(_logits([[0.2, 0.8]]), _logits([[0.7, 0.3]])).item() == 0.0


def test_identical_and_disjoint_distributions():
    p = torch.randn(3, 5, 11)
    assert kl_divergence(p, p).item() == pytest.approx(0.0, abs=1e-6)
    assert alpha(p, p).item() == pytest.approx(1.0, abs=1e-6)
    big = torch.full((1, 4), -1e4)
    p_one, q_one = big.clone(), big.clone()
    p_one[0, 0], q_one[0, 3] = 0.0, 0.0
    assert alpha(p_one, q_one).item() == pytest.approx(0.0, abs=1e-6)


def test_kl_is_zero_where_p_is_zero_and_never_nan():
    p = torch.tensor([[0.0, -float("inf"), 0.0]])  # p puts no mass on the middle token
    q = torch.tensor([[0.0, 5.0, 0.0]])
    value = kl_divergence(p, q)
    q_probs = torch.softmax(q, -1)[0]
    assert torch.isfinite(value)
    assert value.item() == pytest.approx(0.5 * math.log(0.5 / q_probs[0].item()) * 2, rel=1e-5)


def test_kl_temperature_matches_manual_and_is_scaled():
    p, q = torch.randn(4, 7), torch.randn(4, 7)
    t = 2.0
    p_t, q_t = torch.softmax(p / t, -1), torch.softmax(q / t, -1)
    manual = (p_t * (p_t.log() - q_t.log())).sum(-1).mean() * t * t
    assert kl_divergence(p, q, temperature=t).item() == pytest.approx(manual.item(), rel=1e-5)
    with pytest.raises(ValueError, match="temperature"):
        kl_divergence(p, q, temperature=0)


def test_cross_entropy_of_uniform():
    assert cross_entropy(torch.zeros(2, 3, 8), torch.zeros(2, 3, dtype=torch.long)).item() == pytest.approx(math.log(8))


# ---- the pair check ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pair(tiny_pair):
    return SimpleNamespace(target_dir=tiny_pair.target_dir, draft_dir=tiny_pair.draft_hf_dir)


def test_fingerprint_mismatch_is_refused(pair, tmp_path):
    other = tmp_path / "other-draft"
    shutil.copytree(pair.draft_dir, other)
    texts = [(STDLIB / name).read_text() for name in ("os.py", "shutil.py")]
    save_tokenizer(train_tokenizer(texts, 512), other)
    with pytest.raises(TokenizerMismatchError, match="tokenizer mismatch"):
        check_pair(pair.target_dir, other)
    with pytest.raises(TokenizerMismatchError):
        distill(DistillConfig(pair.target_dir, other, STDLIB / "json", tmp_path / "out", minutes=0.1))


def test_vocab_size_mismatch_is_refused(pair, tmp_path):
    other = tmp_path / "padded-draft"
    model = AutoModelForCausalLM.from_pretrained(str(pair.draft_dir))
    model.resize_token_embeddings(model.config.vocab_size + 64)
    model.save_pretrained(str(other))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(pair.draft_dir / name, other / name)
    with pytest.raises(TokenizerMismatchError, match="vocab size mismatch"):
        check_pair(pair.target_dir, other)


def test_config_is_validated_with_field_names(pair, tmp_path):
    base = dict(target=pair.target_dir, draft=pair.draft_dir, data=STDLIB / "json", out=tmp_path)
    with pytest.raises(ValueError, match="generated_fraction"):
        DistillConfig(**base, generated_fraction=1.5)
    with pytest.raises(ValueError, match="temperature"):
        DistillConfig(**base, temperature=0)
    with pytest.raises(ValueError, match="draft"):
        DistillConfig(**{**base, "draft": tmp_path / "nothing"})
    with pytest.raises(ValueError, match="tokens or minutes"):
        DistillConfig(**base, minutes=0, tokens=0)


def test_cli_reads_config_file_and_flags_override(pair, tmp_path):
    parser = argparse.ArgumentParser()
    distill_cli.add_arguments(parser)
    config_file = tmp_path / "distill.json"
    config_file.write_text(json.dumps({"target": str(pair.target_dir), "draft": str(pair.draft_dir),
                                       "data": str(STDLIB / "json"), "out": str(tmp_path / "o"), "lr": 5e-4, "minutes": 3}))
    config = distill_cli.config_from_args(parser.parse_args(["--config", str(config_file), "--minutes", "1.5"]))
    assert config.lr == 5e-4 and config.minutes == 1.5 and config.target == pair.target_dir
    assert distill_cli.run(parser.parse_args(["--target", str(pair.target_dir)])) == 2  # missing --draft etc.


# ---- continuations and a short real run -------------------------------------------------------


def test_greedy_continuation_matches_full_forward(pair):
    model = AutoModelForCausalLM.from_pretrained(str(pair.target_dir)).eval()
    prompts = torch.randint(1, 500, (2, 7), generator=torch.Generator().manual_seed(0))
    ids, logits = continue_prompts(model, prompts, 5)
    assert ids.shape == (2, 12) and logits.shape == (2, 11, model.config.vocab_size)
    with torch.no_grad():
        full = model(input_ids=ids[:, :-1]).logits
    assert torch.allclose(full, logits, atol=1e-4)
    assert torch.equal(ids[:, 7:], logits[:, 6:].argmax(-1))


@pytest.mark.slow
def test_distill_reduces_kl_and_resumes(pair, tmp_path):
    common = dict(target=pair.target_dir, draft=pair.draft_dir, data=STDLIB / "json", out=tmp_path / "out",
                  minutes=0, seq_len=64, batch_size=4, lr=1e-3, warmup_tokens=0, eval_windows=8, eval_generated=2,
                  prompt_len=16, new_tokens=16, generate_batch=4, generated_fraction=0.25)
    report = distill(DistillConfig(**common, tokens=12_000))
    assert report.after.kl < report.before.kl
    assert report.after.alpha > report.before.alpha
    assert (tmp_path / "out" / "final" / "model.safetensors").is_file()
    assert (tmp_path / "out" / "final" / "tokenizer.json").is_file()
    with pytest.raises(FileExistsError, match="resume"):
        distill(DistillConfig(**common, tokens=16_000))
    resumed = distill(DistillConfig(**common, tokens=16_000, resume=True))
    assert resumed.steps > report.steps and resumed.before == report.before


@pytest.mark.slow
def test_target_text_is_the_targets_greedy_output_resumes_and_feeds_distillation(pair, tmp_path):
    from edgespec.cloud.training.data import TokenStream
    from edgespec.cloud.training.target_text import TargetTextConfig, generate_target_text, load_target_text

    tokenizer = load_tokenizer(pair.target_dir)
    ids = np.concatenate([np.asarray(tokenizer.encode((STDLIB / "json" / n).read_text()).ids, dtype=np.uint16)
                          for n in ("decoder.py", "encoder.py")])
    data = tmp_path / "train.bin"
    ids.tofile(data)
    base = dict(target=pair.target_dir, data=data, out_dir=tmp_path / "text", prompt_len=8, new_tokens=6, batch=3)
    assert generate_target_text(TargetTextConfig(**base, sequences=3), progress=lambda m: None) == 3
    assert generate_target_text(TargetTextConfig(**base, sequences=6), progress=lambda m: None) == 6  # resumes
    corpus, prompt_len = load_target_text(tmp_path / "text")
    assert corpus.shape == (6, 14) and prompt_len == 8
    # each row: a window of the training text, then the target's own greedy continuation
    model = AutoModelForCausalLM.from_pretrained(str(pair.target_dir)).eval()
    prompts = torch.from_numpy(corpus[:, :8].astype(np.int64))
    expected, _ = continue_prompts(model, prompts, 6)
    assert np.array_equal(expected.numpy(), corpus)
    text = TokenStream.from_bin(data).ids.tobytes()
    assert all(corpus[i, :8].astype(np.uint16).tobytes() in text for i in range(6))
    with pytest.raises(ValueError, match="another directory"):
        generate_target_text(TargetTextConfig(**{**base, "new_tokens": 7}, sequences=9), progress=lambda m: None)

    def kl_on_corpus(draft_dir):
        draft = AutoModelForCausalLM.from_pretrained(str(draft_dir)).eval()
        with torch.no_grad():
            full = torch.from_numpy(corpus.astype(np.int64))[:, :-1]
            return kl_divergence(model(input_ids=full).logits, draft(input_ids=full).logits).item()

    distill(DistillConfig(target=pair.target_dir, draft=pair.draft_dir, data=data, out=tmp_path / "out",
                          minutes=0, tokens=3_000, seq_len=32, batch_size=2, generate_batch=3, warmup_tokens=0,
                          eval_windows=4, eval_generated=0, prompt_len=8, new_tokens=6, generated_fraction=1.0,
                          corpus=tmp_path / "text"))
    assert "6 target-generated sequences of 14 tokens" in (tmp_path / "out" / "distill.log").read_text()
    assert kl_on_corpus(tmp_path / "out" / "final") < 0.5 * kl_on_corpus(pair.draft_dir)


def test_token_sources_accept_every_documented_format(pair, tmp_path):
    from edgespec.cloud.training.data import load_token_source
    from edgespec.edge.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(pair.target_dir)
    text = "def f(x):\n    return x + 1\n"
    (tmp_path / "one.txt").write_text(text)
    (tmp_path / "rows.jsonl").write_text(json.dumps({"text": text}) + "\n\n" + json.dumps({"text": text}) + "\n")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "a.py").write_text(text)
    (tmp_path / "dir" / "b.txt").write_text(text)
    (tmp_path / "dir" / "skip.bin").write_bytes(b"\x00\x01")
    n = len(tokenizer.encode(text).ids) + 1  # + EOS
    assert len(load_token_source(tmp_path / "one.txt", tokenizer, 0, 512)) == n
    assert len(load_token_source(tmp_path / "rows.jsonl", tokenizer, 0, 512)) == 2 * n
    assert len(load_token_source(tmp_path / "dir", tokenizer, 0, 512)) == 2 * n
    (tmp_path / "bad.jsonl").write_text(json.dumps({"content": text}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_token_source(tmp_path / "bad.jsonl", tokenizer, 0, 512)
    with pytest.raises(ValueError, match="vocab size"):
        load_token_source(tmp_path / "one.txt", tokenizer, 0, 10)
