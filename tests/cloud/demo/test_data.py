"""The demo corpus split, tokenizer stage and prompt files (edgespec.cloud.training.corpus, edgespec.cloud.demo.data and .prompts)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from edgespec.cloud.training.corpus import SPLITS, SplitFractions, is_data_like, list_corpus, split_digest, split_of
from edgespec.cloud.demo.data import DataConfig, prepare_data
from edgespec.cloud.demo.prompts import PromptSpec, header_ends
from edgespec.cloud.training.data import TokenStream
from edgespec.cloud.training.loop import Budget, LRSchedule
from edgespec.edge.tokenizer import load_tokenizer

torch.set_num_threads(1)


def _module(name: str, n_funcs: int = 6) -> str:
    # Every file carries identifiers unique to it, so leaks between splits are detectable.
    tag = name.replace("/", "_").replace(".py", "")
    parts = [f'"""Module {tag}."""\n\nimport os\n\nCONSTANT_{tag} = {len(tag)}\n']
    for i in range(n_funcs):
        parts.append(
            f"\n\ndef func_{tag}_{i}(value, other=None):\n"
            f'    """Return something about {tag} number {i}."""\n'
            f"    result = value + {i}\n"
            f"    if other is not None:\n"
            f"        result = result * other\n"
            f"    return result\n"
        )
    parts.append(f"\n\nclass Thing_{tag}:\n    def method(self):\n        return CONSTANT_{tag}\n")
    return "".join(parts)


@pytest.fixture(scope="module")
def fake_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("stdlib")
    names = [f"mod{i:02d}.py" for i in range(40)] + [f"pkg/sub{i:02d}.py" for i in range(40)]
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(_module(name))
    (root / "site-packages").mkdir()
    (root / "site-packages" / "thirdparty.py").write_text(_module("thirdparty.py"))
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "cached.py").write_text(_module("cached.py"))
    (root / "charmap_table.py").write_text("table = (\n" + "".join(f"    '\\x{i:02x}'\n" for i in range(200)) + ")\n")
    (root / "latin1.py").write_bytes("# caf\u00e9\nx = 1\n".encode("latin-1"))
    return root


def test_split_of_is_deterministic_and_roughly_proportional():
    paths = [f"pkg{i}/module{i}.py" for i in range(4000)]
    first = [split_of(p) for p in paths]
    assert first == [split_of(p) for p in paths]
    shares = {s: first.count(s) / len(paths) for s in SPLITS}
    assert 0.03 < shares["heldout"] < 0.07 and 0.03 < shares["validation"] < 0.07
    wider = SplitFractions(validation_percent=10, heldout_percent=20)
    assert 0.17 < sum(split_of(p, wider) == "heldout" for p in paths) / len(paths) < 0.23


def test_split_fractions_are_validated():
    with pytest.raises(ValueError, match="heldout_percent"):
        SplitFractions(heldout_percent=0)


def test_list_corpus_excludes_generated_and_foreign_files(fake_root):
    files = list_corpus(fake_root)
    paths = {f.relpath for f in files}
    assert len(paths) == 80
    assert not any("site-packages" in p or "__pycache__" in p for p in paths)
    assert "charmap_table.py" not in paths and "latin1.py" not in paths
    assert all(f.split == split_of(f.relpath) for f in files)
    assert split_digest(files) == split_digest(list_corpus(fake_root))


def test_data_like_detection():
    assert is_data_like("t = {\n" + "    0x0041: 0x0061,\n" * 50 + "}\n")
    assert not is_data_like(_module("ordinary.py"))


@pytest.mark.slow  # reads and hashes the whole standard library
def test_real_stdlib_split_is_disjoint_and_stable():
    files = list_corpus()
    assert len(files) > 500
    assert len({f.relpath for f in files}) == len(files)
    assert {f.split for f in files} == set(SPLITS)
    assert not any(f.relpath.startswith("pydoc_data/topics") for f in files)
    assert split_digest(files) == split_digest(list_corpus())


@pytest.fixture(scope="module")
def prepared(fake_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("data")
    spec = PromptSpec(count=4, min_tokens=10, max_tokens=80, max_per_file=4)
    manifest = prepare_data(DataConfig(out, root=fake_root, vocab_size=400, heldout_prompts=spec,
                                       tuning_prompts=PromptSpec(count=4, min_tokens=10, max_tokens=80, max_per_file=4, seed=1),
                                       fractions=SplitFractions(validation_percent=15, heldout_percent=15)))
    return out, manifest


def test_heldout_text_never_reaches_train_tokens(prepared):
    out, manifest = prepared
    by_split = {s: [f["relpath"] for f in manifest["files"] if f["split"] == s] for s in SPLITS}
    assert all(by_split.values()), "the fake corpus must populate every split"
    assert not set(by_split["train"]) & set(by_split["heldout"])
    assert not set(by_split["train"]) & set(by_split["validation"])
    tokenizer = load_tokenizer(out / "tokenizer")
    train_text = tokenizer.decode(np.fromfile(out / "train.bin", dtype=np.uint16).tolist(), skip_special_tokens=False)
    for relpath in by_split["heldout"] + by_split["validation"]:
        tag = relpath.replace("/", "_").replace(".py", "")
        assert f"func_{tag}_0" not in train_text
    for relpath in by_split["train"][:5]:
        assert f"func_{relpath.replace('/', '_').replace('.py', '')}_0" in train_text


def test_prompts_come_from_their_split_and_end_at_a_header(prepared):
    out, manifest = prepared
    split = {f["relpath"]: f["split"] for f in manifest["files"]}
    tokenizer = load_tokenizer(out / "tokenizer")
    for name, expected in (("heldout.jsonl", "heldout"), ("tuning.jsonl", "validation")):
        rows = [json.loads(line) for line in (out / name).read_text().splitlines()]
        assert len(rows) == 4
        for row in rows:
            assert split[row["source"]] == expected
            assert not row["prompt"].endswith("\n")
            assert row["prompt"].rstrip().endswith(":")
            assert 10 <= len(tokenizer.encode(row["prompt"]).ids) == row["prompt_tokens"] <= 80


def test_prepare_data_is_reproducible(prepared, fake_root, tmp_path):
    out, manifest = prepared
    spec = PromptSpec(count=4, min_tokens=10, max_tokens=80, max_per_file=4)
    again = prepare_data(DataConfig(tmp_path, root=fake_root, vocab_size=400, heldout_prompts=spec,
                                    tuning_prompts=PromptSpec(count=4, min_tokens=10, max_tokens=80, max_per_file=4, seed=1),
                                    fractions=SplitFractions(validation_percent=15, heldout_percent=15)))
    assert again["split_digest"] == manifest["split_digest"]
    assert again["tokenizer_fingerprint"] == manifest["tokenizer_fingerprint"]
    assert (tmp_path / "heldout.jsonl").read_text() == (out / "heldout.jsonl").read_text()
    assert (tmp_path / "train.bin").read_bytes() == (out / "train.bin").read_bytes()


def test_header_ends_handles_multiline_signatures_and_one_liners():
    source = "def a(x,\n      y):\n    return x\n\n\nclass B: pass\n\n\n@dec\ndef c():\n    '''doc'''\n"
    assert header_ends(source) == [2, 10]
    assert header_ends("def broken(:\n") == []


def test_data_config_validates_fields(tmp_path):
    with pytest.raises(ValueError, match="vocab_size"):
        DataConfig(tmp_path, vocab_size=100)
    with pytest.raises(ValueError, match="root"):
        DataConfig(tmp_path, root=tmp_path / "missing")


def test_token_stream_windows():
    stream = TokenStream(np.arange(1000, dtype=np.int64))
    fixed = stream.fixed_windows(5, 100)
    assert fixed.shape == (5, 100) and torch.equal(fixed, stream.fixed_windows(5, 100))
    assert torch.equal(fixed[:, 1:] - fixed[:, :-1], torch.ones(5, 99, dtype=torch.int64))
    a = stream.random_windows(3, 50, torch.Generator().manual_seed(1))
    b = stream.random_windows(3, 50, torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="fewer than a window"):
        stream.fixed_windows(1, 5000)


def test_budget_and_schedule():
    budget = Budget(tokens=1000, minutes=1.0)
    assert budget.progress(500, 0) == 0.5 and budget.progress(100, 45) == 0.75 and budget.progress(2000, 0) == 1.0
    with pytest.raises(ValueError, match="tokens or minutes"):
        Budget()
    schedule = LRSchedule(peak=1.0, warmup_tokens=100, min_ratio=0.1)
    assert schedule.lr(49, 0.0) == pytest.approx(0.5)
    assert schedule.lr(1000, 0.0) == pytest.approx(1.0)
    assert schedule.lr(1000, 0.5) == pytest.approx(0.55)
    assert schedule.lr(1000, 1.0) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="min_ratio"):
        LRSchedule(peak=1.0, warmup_tokens=0, min_ratio=2.0)
