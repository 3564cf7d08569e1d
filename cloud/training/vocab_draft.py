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
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from edgespec.cloud.training.draft_vocab import (
    DRAFT_VOCAB_FILE,
    DraftVocab,
    VocabMappedLM,
    load_draft_vocab,
    save_draft_vocab,
)

def choose_vocab(counts: Counter, size: int, *, always: list[int], unknown: int, target_vocab_size: int) -> DraftVocab:
    """The ``size`` most frequent ids of ``counts`` plus ``always`` (special tokens, EOS ids)
    and ``unknown``, in target-id order."""
    keep = set(always) | {unknown}
    for token, _ in counts.most_common():
        if len(keep) >= size:
            break
        keep.add(int(token))
    ordered = sorted(keep)
    return DraftVocab(target_vocab_size, ordered, ordered.index(unknown))


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
    config.vocab_size = vocab.draft_vocab_size
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
    save_draft_vocab(vocab, out)
    return out


def copy_draft(source: Path, target_dir: Path, out: Path) -> Path:
    """An existing draft (e.g. a shipped fp16 one) as a starting point to train further: fp32
    weights, its draft vocabulary, the target's tokenizer."""
    draft = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, local_files_only=True)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    draft.save_pretrained(out)
    AutoTokenizer.from_pretrained(target_dir, local_files_only=True).save_pretrained(out)
    vocab = load_draft_vocab(source)
    if vocab is not None:
        save_draft_vocab(vocab, out)
    return out


def load_draft(directory: Path, dtype=torch.float32):
    """A draft directory as a torch model with target ids in and full-width logits out (mapped
    when it has a draft vocabulary)."""
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, local_files_only=True).eval()
    vocab = load_draft_vocab(directory)
    return model if vocab is None else VocabMappedLM(model, vocab).eval()


def expand_to_target_vocab(directory: Path, out: Path) -> Path:
    """A reduced-vocabulary draft as an ordinary full-vocabulary model (for tools that need
    one, such as transformers' assisted generation): a target id outside the draft vocabulary
    embeds as the unknown token, and its output row is zero (logit 0: it can only win where
    every draft token's logit is negative, which a trained draft's top token never is)."""
    vocab = load_draft_vocab(directory)
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
