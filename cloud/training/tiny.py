"""Tiny draft/target pairs built in seconds, for tests and for trying the stack out.

The target is a randomly initialised Llama-style model; the draft is the target cut down
to its first layer (same embeddings, norm and head), so the two agree often but not always:
every path of the accept rule (accept, reject, bonus) is exercised. The tokenizer is a small
byte-level BPE trained on a few standard-library files. Nothing is downloaded.
"""

from __future__ import annotations

import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

TINY_CORPUS_FILES = ("argparse.py", "textwrap.py", "json/encoder.py", "json/decoder.py", "string.py")
EOS_TOKEN = "<|endoftext|>"


@dataclass(frozen=True)
class TinyPair:
    target_dir: Path
    draft_dir: Path  # a Hugging Face directory; export it with edgespec.cloud.training.export


def corpus_text(files: tuple[str, ...] = TINY_CORPUS_FILES) -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [(stdlib / name).read_text(encoding="utf-8") for name in files]


def train_tokenizer(texts: list[str], vocab_size: int = 512) -> Tokenizer:
    """A byte-level BPE tokenizer, the same kind the demo pair uses."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def save_tokenizer(tokenizer: Tokenizer, out_dir: Path) -> None:
    """Writes tokenizer.json (and the transformers wrapper files) into ``out_dir``."""
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS_TOKEN)
    fast.save_pretrained(str(out_dir))


def _init_spread(model: torch.nn.Module, std: float, seed: int) -> None:
    # NOTE: a wide init spreads the logits, so greedy argmax ties (which float noise
    # between batched and unbatched forwards could flip) are vanishingly rare.
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() >= 2:
                param.copy_(torch.randn(param.shape, generator=gen) * std)


def tiny_llama_config(vocab_size: int, layers: int = 4, hidden: int = 64, max_positions: int = 512) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=0,
        pad_token_id=0,
    )


def _damp_upper_layers(model: LlamaForCausalLM, factor: float) -> None:
    # Layers above the first write less into the residual stream, so the one-layer draft
    # (which keeps only the first) agrees with the target on a good share of tokens.
    with torch.no_grad():
        for layer in model.model.layers[1:]:
            layer.self_attn.o_proj.weight.mul_(factor)
            layer.mlp.down_proj.weight.mul_(factor)


def build_tiny_pair(
    out_dir: str | Path, *, seed: int = 0, vocab_size: int = 512, layers: int = 4, damping: float = 0.15
) -> TinyPair:
    """Builds (or reuses) a tiny target and its one-layer draft under ``out_dir``."""
    transformers.utils.logging.disable_progress_bar()
    out = Path(out_dir)
    pair = TinyPair(out / "target", out / "draft-hf")
    if (pair.target_dir / "config.json").is_file() and (pair.draft_dir / "config.json").is_file():
        return pair
    tokenizer = train_tokenizer(corpus_text(), vocab_size)
    torch.manual_seed(seed)
    target = LlamaForCausalLM(tiny_llama_config(tokenizer.get_vocab_size(), layers=layers)).eval()
    _init_spread(target, std=0.35, seed=seed)
    _damp_upper_layers(target, factor=damping)
    draft = LlamaForCausalLM(tiny_llama_config(tokenizer.get_vocab_size(), layers=1)).eval()
    state = {k: v for k, v in target.state_dict().items() if not k.startswith("model.layers.") or k.startswith("model.layers.0.")}
    draft.load_state_dict(state)
    for model, path in ((target, pair.target_dir), (draft, pair.draft_dir)):
        model.save_pretrained(str(path))
        save_tokenizer(tokenizer, path)
    return pair


def build_tiny_gpt2(out_dir: str | Path, *, seed: int = 0, vocab_size: int = 512) -> Path:
    """A tiny GPT-2-architecture model (learned positions, fused qkv), for export parity tests."""
    out = Path(out_dir)
    if (out / "config.json").is_file():
        return out
    tokenizer = train_tokenizer(corpus_text(), vocab_size)
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=tokenizer.get_vocab_size(),
        n_positions=512,
        n_embd=64,
        n_layer=2,
        n_head=4,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config).eval()
    _init_spread(model, std=0.2, seed=seed)
    model.save_pretrained(str(out))
    save_tokenizer(tokenizer, out)
    return out


def word_tokenizer(words: list[str]) -> Tokenizer:
    """A word-level tokenizer over exactly ``words`` (ids in that order), split on whitespace."""
    tokenizer = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, unk_token=words[0]))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tokenizer


def build_tiny_vocab_pair(out_dir: str | Path, *, vocab_size: int = 5, seed: int = 0, spread: float = 0.15) -> TinyPair:
    """A target and a one-layer draft over ``vocab_size`` tokens (the first is the end-of-text
    token): small enough that the exact distribution of a few generated tokens can be
    enumerated, as the goodness-of-fit tests of sampling need. ``spread`` scales the weights,
    so that p is far from uniform yet never a point mass."""
    transformers.utils.logging.disable_progress_bar()
    out = Path(out_dir)
    pair = TinyPair(out / "target", out / "draft-hf")
    if (pair.target_dir / "config.json").is_file() and (pair.draft_dir / "config.json").is_file():
        return pair
    words = [EOS_TOKEN] + [chr(ord("a") + i) for i in range(vocab_size - 1)]
    tokenizer = word_tokenizer(words)
    for layers, path, model_seed in ((2, pair.target_dir, seed), (1, pair.draft_dir, seed + 1)):
        torch.manual_seed(model_seed)
        model = LlamaForCausalLM(tiny_llama_config(vocab_size, layers=layers, hidden=32, max_positions=64)).eval()
        _init_spread(model, std=spread, seed=model_seed)
        model.save_pretrained(str(path))
        save_tokenizer(tokenizer, path)
    return pair


# Size arguments per family (model_type as in config.json): Llama-style names unless listed.
LLAMA_SIZES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, max_position_embeddings=512)
FAMILY_SIZES: dict[str, dict] = {
    **{name: LLAMA_SIZES for name in ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3",
                                       "starcoder2", "qwen2_moe", "qwen3_moe", "mixtral")},
    "gpt2": dict(n_embd=64, n_layer=4, n_head=4, n_positions=512),
    "codegen": dict(n_embd=64, n_layer=4, n_head=4, n_positions=512, n_ctx=512, rotary_dim=8),
    "gpt_neox": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                     max_position_embeddings=512),
    "opt": dict(hidden_size=64, ffn_dim=128, num_hidden_layers=4, num_attention_heads=4, max_position_embeddings=512,
                word_embed_proj_dim=64),
    "falcon": dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_kv_heads=2, new_decoder_architecture=True,
                   max_position_embeddings=512),
    "bloom": dict(hidden_size=64, n_layer=4, n_head=4),  # ALiBi: no max positions in the config
}
MOE_SIZES = dict(num_experts=4, num_local_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                 shared_expert_intermediate_size=64)


def build_tiny_family(out_dir: str | Path, model_type: str, *, seed: int = 0, vocab_size: int = 512, **config: object) -> Path:
    """A tiny random model of a Hugging Face family (``model_type`` as in config.json, one of
    FAMILY_SIZES) with the tiny tokenizer, e.g. ``build_tiny_family(d, "gemma3_text",
    sliding_window=8)``: extra keywords go to its config."""
    if model_type not in FAMILY_SIZES:
        raise ValueError(f"build_tiny_family knows {sorted(FAMILY_SIZES)}, not {model_type!r}")
    transformers.utils.logging.disable_progress_bar()
    out = Path(out_dir)
    if (out / "config.json").is_file():
        return out
    tokenizer = train_tokenizer(corpus_text(), vocab_size)
    torch.manual_seed(seed)
    values = dict(FAMILY_SIZES[model_type], vocab_size=tokenizer.get_vocab_size(), tie_word_embeddings=False,
                  bos_token_id=0, eos_token_id=0, pad_token_id=0)
    if model_type.endswith("_moe") or model_type == "mixtral":
        values.update(MOE_SIZES)
    values.update(config)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(model_type, **values)).eval()
    _init_spread(model, std=0.35, seed=seed)
    model.save_pretrained(str(out))
    save_tokenizer(tokenizer, out)
    return out


def build_tiny_draft_for(target_dir: str | Path, out_dir: str | Path, *, seed: int = 0, max_positions: int = 4096) -> Path:
    """A one-layer random Llama over ``target_dir``'s tokenizer (its files copied over): a draft
    that shares the target's vocabulary but not its knowledge, for exercising a real target's
    serving path (rejections galore) before a trained draft exists."""
    import json

    from edgespec.cloud.training.export import copy_tokenizer_files

    target_dir, out = Path(target_dir), Path(out_dir)
    config = json.loads((target_dir / "config.json").read_text())
    vocab_size = (config.get("text_config") or config)["vocab_size"]
    draft_config = tiny_llama_config(vocab_size, layers=1, hidden=32, max_positions=max_positions)
    draft_config.tie_word_embeddings = True
    torch.manual_seed(seed)
    LlamaForCausalLM(draft_config).save_pretrained(str(out))
    copy_tokenizer_files(target_dir, out)
    return out
