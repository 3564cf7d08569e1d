"""Shapes of the demo models: a deep, narrow Llama target and a two-layer draft.

On CPU the cost of a forward at this scale is mostly per layer (~1 ms a layer, almost
regardless of width), so depth is what makes the target slow at inference and worth
speculating for, while a narrow width keeps it cheap to train on one thread.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from transformers import LlamaConfig, LlamaForCausalLM

from edgespec.cloud.demo.data import EOS_ID


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    max_positions: int = 512
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "kv_heads", "intermediate", "max_positions"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")

    def llama_config(self, vocab_size: int) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=self.hidden,
            intermediate_size=self.intermediate,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            max_position_embeddings=self.max_positions,
            tie_word_embeddings=self.tie_embeddings,
            bos_token_id=EOS_ID,
            eos_token_id=EOS_ID,
            pad_token_id=EOS_ID,
        )


# head_dim 64 on both layers keeps the attention matmuls reasonably shaped on CPU.
TARGET_SHAPES = {
    "12x256": ModelShape(layers=12, hidden=256, heads=4, kv_heads=4, intermediate=704),
    "12x192": ModelShape(layers=12, hidden=192, heads=3, kv_heads=3, intermediate=512),
}
# The first demo draft had one layer; a one-layer transformer cannot copy from its context
# (an induction head needs a second layer to read what the first wrote), and code repeats
# itself, so the shipped draft has two.
DRAFT_SHAPES = {
    "1x128": ModelShape(layers=1, hidden=128, heads=4, kv_heads=4, intermediate=384),
    "2x128": ModelShape(layers=2, hidden=128, heads=4, kv_heads=4, intermediate=384),
}
DRAFT_SHAPE = DRAFT_SHAPES["2x128"]


@torch.no_grad()
def grow(model: LlamaForCausalLM, shape: ModelShape) -> LlamaForCausalLM:
    """A ``shape``-deep copy of ``model`` that computes the same function at first.

    ``model``'s layers come first, unchanged; each new layer starts with zero output
    projections (attention ``o_proj`` and MLP ``down_proj``), so it adds nothing to the
    residual stream until training moves those weights. Everything but the depth must match.
    """
    old = model.config
    new_config = shape.llama_config(old.vocab_size)
    for name in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size", "tie_word_embeddings"):
        if getattr(old, name) != getattr(new_config, name):
            raise ValueError(f"cannot grow: {name} is {getattr(old, name)} in the model, {getattr(new_config, name)} in {shape}")
    if shape.layers < old.num_hidden_layers:
        raise ValueError(f"cannot grow {old.num_hidden_layers} layers into {shape.layers}")
    grown = LlamaForCausalLM(new_config)
    missing, unexpected = grown.load_state_dict(model.state_dict(), strict=False)
    if unexpected or any(not k.startswith("model.layers.") for k in missing):
        raise ValueError(f"cannot grow: unexpected {unexpected}, missing {missing}")
    for layer in grown.model.layers[old.num_hidden_layers :]:
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    return grown


def param_count(model) -> int:
    """Unique parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
