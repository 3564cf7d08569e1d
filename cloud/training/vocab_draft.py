"""A draft cut from its target, with a reduced vocabulary (as FR-Spec and EAGLE-3 do).

A real chat target has a large vocabulary (SmolLM2: 49,152 rows of 576): its output layer alone
costs a small draft more than all of the draft's transformer layers, and most rows are tokens
the replies never use. The draft therefore speaks a *draft vocabulary*: the ``size`` tokens
most frequent in the target's own replies, plus every special token. ``draft_vocab.json``
beside the draft's weights maps draft ids to target ids::

    {"format": 1, "target_vocab_size": V, "draft_to_target": [...], "unknown_draft_id": u}

A target token outside the draft vocabulary enters the draft as ``u`` (the unknown token);
the draft never proposes one (its logits there are a very negative number, so its q is 0).
The verifier is untouched: a draft that cannot propose a token only loses acceptance there.

``build_draft`` starts the draft from the target itself: the rows of the target's embedding
and output layer for the draft vocabulary (one matrix where the target ties them), ``layers``
of the target's decoder layers and its final norm; distillation (``distill_replies``) then trains all of it.
``MappedDraft`` runs such a draft in torch with the target's ids in and full-width logits
out, the interface the ONNX export gives the device.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

DRAFT_VOCAB_FILE = "draft_vocab.json"
OUTSIDE_LOGIT = -1e9  # a finite "never": softmax gives exactly 0, nothing turns NaN


@dataclass(frozen=True)
class DraftVocab:
    draft_to_target: list[int]
    target_vocab_size: int
    unknown_draft_id: int

    def __post_init__(self) -> None:
        ids = self.draft_to_target
        if len(set(ids)) != len(ids):
            raise ValueError("draft_to_target repeats a target id")
        if not ids or min(ids) < 0 or max(ids) >= self.target_vocab_size:
            raise ValueError(f"draft_to_target must hold ids in [0, {self.target_vocab_size})")
        if not 0 <= self.unknown_draft_id < len(ids):
            raise ValueError(f"unknown_draft_id must be in [0, {len(ids)}), got {self.unknown_draft_id}")

    @property
    def size(self) -> int:
        return len(self.draft_to_target)

    def target_to_draft(self) -> torch.Tensor:
        """[V] long: each target id's draft id (the unknown id where it has none)."""
        table = torch.full((self.target_vocab_size,), self.unknown_draft_id, dtype=torch.long)
        table[torch.tensor(self.draft_to_target)] = torch.arange(self.size)
        return table

    def save(self, directory: Path) -> None:
        body = {"format": 1, "target_vocab_size": self.target_vocab_size, "draft_to_target": self.draft_to_target,
                "unknown_draft_id": self.unknown_draft_id}
        (Path(directory) / DRAFT_VOCAB_FILE).write_text(json.dumps(body))

    @classmethod
    def load(cls, directory: Path) -> "DraftVocab | None":
        path = Path(directory) / DRAFT_VOCAB_FILE
        if not path.is_file():
            return None
        body = json.loads(path.read_text())
        if body.get("format") != 1:
            raise ValueError(f"{path}: unknown format {body.get('format')!r} (this version reads 1)")
        return cls(list(body["draft_to_target"]), int(body["target_vocab_size"]), int(body["unknown_draft_id"]))


def choose_vocab(counts: Counter, size: int, *, always: list[int], unknown: int, target_vocab_size: int) -> DraftVocab:
    """The ``size`` most frequent ids of ``counts`` plus ``always`` (special tokens, EOS ids)
    and ``unknown``, in target-id order."""
    keep = set(always) | {unknown}
    for token, _ in counts.most_common():
        if len(keep) >= size:
            break
        keep.add(int(token))
    ordered = sorted(keep)
    return DraftVocab(ordered, target_vocab_size, ordered.index(unknown))


def special_ids(tokenizer) -> list[int]:
    ids = set(tokenizer.all_special_ids)
    ids.update(int(i) for i in getattr(tokenizer, "added_tokens_decoder", {}) or {})
    return sorted(ids)


def build_draft(target_dir: Path, vocab: DraftVocab, layers: list[int], out: Path) -> Path:
    """Writes a draft HF directory cut from the target (see the module docstring)."""
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32, local_files_only=True)
    config = AutoConfig.from_pretrained(target_dir, local_files_only=True)
    n_layers = config.num_hidden_layers
    if not layers or min(layers) < 0 or max(layers) >= n_layers:
        raise ValueError(f"layers must be indices in [0, {n_layers}), got {layers}")
    table = vocab.target_to_draft()
    config.num_hidden_layers = len(layers)
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[i] for i in layers]
    config.vocab_size = vocab.size
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            setattr(config, name, int(table[value]))
        elif isinstance(value, list):
            setattr(config, name, [int(table[v]) for v in value])
    draft = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    source = target.state_dict()
    state = {}
    for name, tensor in draft.state_dict().items():
        if name.startswith("model.layers."):
            index = int(name.split(".")[2])
            state[name] = source[name.replace(f"model.layers.{index}.", f"model.layers.{layers[index]}.", 1)]
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):  # tied or not, as the target
            state[name] = source[name][torch.tensor(vocab.draft_to_target)]
        else:
            state[name] = source[name]
    draft.load_state_dict(state)
    if config.tie_word_embeddings:
        draft.tie_weights()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    draft.save_pretrained(out)
    AutoTokenizer.from_pretrained(target_dir, local_files_only=True).save_pretrained(out)
    vocab.save(out)
    return out


class MappedDraft(torch.nn.Module):
    """A reduced-vocabulary draft seen from outside: target ids in, [.., V] logits out."""

    def __init__(self, model, vocab: DraftVocab):
        super().__init__()
        self.model, self.vocab = model, vocab
        self.register_buffer("t2d", vocab.target_to_draft(), persistent=False)
        self.register_buffer("d2t", torch.tensor(vocab.draft_to_target), persistent=False)

    def forward(self, input_ids: torch.Tensor, **kwargs):
        out = self.model(input_ids=self.t2d[input_ids], **kwargs)
        small = out.logits
        full = small.new_full(small.shape[:-1] + (self.vocab.target_vocab_size,), OUTSIDE_LOGIT)
        full[..., self.d2t] = small
        out.logits = full
        return out


def load_draft(directory: Path, dtype=torch.float32):
    """A draft directory as a torch model with target ids in and full-width logits out (mapped
    when it has a draft vocabulary)."""
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, local_files_only=True).eval()
    vocab = DraftVocab.load(directory)
    return model if vocab is None else MappedDraft(model, vocab).eval()


def expand_to_target_vocab(directory: Path, out: Path) -> Path:
    """A reduced-vocabulary draft as an ordinary full-vocabulary model (for tools that need
    one, such as transformers' assisted generation): a target id outside the draft vocabulary
    embeds as the unknown token, and its output row is zero (logit 0: it can only win where
    every draft token's logit is negative, which a trained draft's top token never is)."""
    vocab = DraftVocab.load(directory)
    if vocab is None:
        raise ValueError(f"{directory} has no {DRAFT_VOCAB_FILE}: it is a full-vocabulary draft already")
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, local_files_only=True)
    config = model.config
    config.vocab_size, config.tie_word_embeddings = vocab.target_vocab_size, False
    table, d2t = vocab.target_to_draft(), torch.tensor(vocab.draft_to_target)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            setattr(config, name, vocab.draft_to_target[value])
        elif isinstance(value, list):
            setattr(config, name, [vocab.draft_to_target[v] for v in value])
    full = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = model.state_dict()
    embedding = state["model.embed_tokens.weight"]
    head = state.get("lm_head.weight", embedding)
    state["model.embed_tokens.weight"] = embedding[table]
    full_head = head.new_zeros(vocab.target_vocab_size, head.shape[1])
    full_head[d2t] = head
    state["lm_head.weight"] = full_head
    full.load_state_dict(state)
    out = Path(out)
    full.save_pretrained(out)
    for path in Path(directory).iterdir():
        if path.is_file() and path.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            (out / path.name).write_bytes(path.read_bytes())
    return out
