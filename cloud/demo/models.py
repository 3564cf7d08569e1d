"""Shapes of the demo models: a deep, narrow Llama target and a one-layer draft.

On CPU the cost of a forward at this scale is mostly per layer (~1 ms a layer, almost
regardless of width), so depth is what makes the target slow at inference and worth
speculating for, while a narrow width keeps it cheap to train on one thread.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import LlamaConfig

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
DRAFT_SHAPE = ModelShape(layers=1, hidden=128, heads=4, kv_heads=4, intermediate=384)


def param_count(model) -> int:
    """Unique parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
