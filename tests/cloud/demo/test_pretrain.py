"""Budgeted, resumable pretraining and the ship stage (edgespec.cloud.demo.pretrain / ship / train)."""

from __future__ import annotations

import argparse
import json
import shutil

import pytest
import torch

from edgespec.cli import train_demo as train_demo_cli
from edgespec.cloud.demo import train as train_demo
from edgespec.cloud.training.corpus import SplitFractions
from edgespec.cloud.demo.data import DataConfig, prepare_data
from edgespec.cloud.demo.models import DRAFT_SHAPE, TARGET_SHAPES, ModelShape
from edgespec.cloud.demo.pretrain import PretrainConfig, pretrain
from edgespec.cloud.demo.prompts import PromptSpec
from edgespec.cloud.demo.ship import ship
from edgespec.cloud.training.loop import Budget, LRSchedule
from edgespec.edge.tokenizer import fingerprint, load_tokenizer

pytestmark = pytest.mark.slow  # trains tokenizers and models

torch.set_num_threads(1)


def _module(tag: str, n_funcs: int) -> str:
    funcs = "".join(f"\n\ndef {tag}_{i}(value):\n    \"\"\"Scale {tag}.\"\"\"\n    return value * {i} + len({tag!r})\n" for i in range(n_funcs))
    return f"import os\n\nNAME = {tag!r}\n" + funcs


TINY = ModelShape(layers=2, hidden=32, heads=2, kv_heads=1, intermediate=64, max_positions=128)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("stdlib")
    for i in range(60):
        (root / f"m{i:02d}.py").write_text(_module(f"m{i:02d}", n_funcs=10))
    out = tmp_path_factory.mktemp("data")
    spec = PromptSpec(count=2, min_tokens=10, max_tokens=60, max_per_file=4)
    prepare_data(DataConfig(out, root=root, vocab_size=300, heldout_prompts=spec, tuning_prompts=spec,
                            fractions=SplitFractions(validation_percent=15, heldout_percent=15)))
    return out


def _config(data_dir, out, tokens):
    return PretrainConfig(data_dir, out, TINY, Budget(tokens=tokens), seq_len=64, batch_size=2,
                          schedule=LRSchedule(peak=3e-3, warmup_tokens=256), eval_windows=4)


def test_shapes_are_what_the_demo_promises():
    from transformers import LlamaForCausalLM

    from edgespec.cloud.demo.models import param_count

    assert param_count(LlamaForCausalLM(DRAFT_SHAPE.llama_config(4096))) <= 1_000_000
    assert TARGET_SHAPES["12x192"].layers == 12 and DRAFT_SHAPE.layers == 2
    with pytest.raises(ValueError, match="multiple of heads"):
        ModelShape(layers=1, hidden=30, heads=4, kv_heads=4, intermediate=8)


def test_grow_adds_layers_that_change_nothing_until_trained():
    from transformers import LlamaForCausalLM

    from edgespec.cloud.demo.models import grow

    torch.manual_seed(0)
    one = LlamaForCausalLM(ModelShape(layers=1, hidden=32, heads=2, kv_heads=1, intermediate=64).llama_config(300)).eval()
    deeper = grow(one, TINY).eval()
    assert deeper.config.num_hidden_layers == 2
    ids = torch.randint(0, 300, (2, 20))
    with torch.no_grad():
        assert torch.allclose(one(input_ids=ids).logits, deeper(input_ids=ids).logits, atol=1e-6)
    # the new layer's inputs are live, so training reaches it
    deeper.train()
    deeper(input_ids=ids).logits.sum().backward()
    assert deeper.model.layers[1].self_attn.o_proj.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="hidden_size"):
        grow(one, ModelShape(layers=2, hidden=64, heads=2, kv_heads=1, intermediate=64))
    with pytest.raises(ValueError, match="cannot grow 2 layers into 1"):
        grow(deeper, ModelShape(layers=1, hidden=32, heads=2, kv_heads=1, intermediate=64))


def test_pretrain_lowers_loss_resumes_and_extends(data_dir, tmp_path):
    out = tmp_path / "run"
    state = pretrain(_config(data_dir, out, tokens=64 * 2 * 30))
    assert state["step"] == 30 and state["evals"][-1]["val_loss"] < 5.6  # ln(300) = 5.70 at init
    assert (out / "final" / "tokenizer.json").is_file() and (out / "checkpoint" / "optimizer.pt").is_file()
    again = pretrain(_config(data_dir, out, tokens=64 * 2 * 30))  # budget spent: nothing to do
    assert again["step"] == 30
    longer = pretrain(_config(data_dir, out, tokens=64 * 2 * 40))
    assert longer["step"] == 40 and "resumed" in (out / "train.log").read_text()


def test_pretrain_config_names_bad_fields(data_dir, tmp_path):
    with pytest.raises(ValueError, match="seq_len"):
        PretrainConfig(data_dir, tmp_path, TINY, Budget(tokens=10), seq_len=1000)
    with pytest.raises(ValueError, match="batch_size"):
        PretrainConfig(data_dir, tmp_path, TINY, Budget(tokens=10), seq_len=64, batch_size=0)


def test_ship_writes_fp16_target_and_matching_draft(data_dir, tmp_path):
    out = tmp_path / "demo"
    shutil.copytree(data_dir, out / "data")
    pretrain(_config(out / "data", out / "target", tokens=64 * 2 * 4))
    pretrain(_config(out / "data", out / "draft", tokens=64 * 2 * 4))
    metrics = ship(out, tmp_path / "shipped")
    target_cfg = json.loads((tmp_path / "shipped" / "target" / "config.json").read_text())
    assert target_cfg["dtype"] == "float16"
    assert (tmp_path / "shipped" / "target" / "generation_config.json").is_file()
    assert (tmp_path / "shipped" / "draft-hf" / "model.safetensors").is_file()
    assert metrics["target"]["tokens"] == 64 * 2 * 4
    assert metrics["tokenizer_fingerprint"] == fingerprint(load_tokenizer(tmp_path / "shipped" / "draft-hf"))
    assert json.loads((tmp_path / "shipped" / "metrics.json").read_text())["draft"]["params"] > 0
    card = (tmp_path / "shipped" / "README.md").read_text()
    assert metrics["tokenizer_fingerprint"] in card
    assert f"{metrics['target']['params']:,}" in card and f"{metrics['draft']['params']:,}" in card


def test_train_demo_arguments_are_validated(capsys):
    parser = argparse.ArgumentParser()
    train_demo_cli.add_arguments(parser)
    assert train_demo_cli.run(parser.parse_args(["--stages", "data,bogus"])) == 2
    assert "stages must be a non-empty subset" in capsys.readouterr().err
    with pytest.raises(ValueError, match="target_shape"):
        train_demo.TrainDemoConfig(target_shape="3x3")
