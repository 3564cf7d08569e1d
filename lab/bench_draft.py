"""Draft cost per token: ONNX Runtime (``DraftModel``) vs torch (transformers), one thread each.

For each model: export it, build a ~200-token context, then run drafting rounds that each
make k single-token forwards against that context and roll back, so the context length stays
fixed. ORT and torch blocks alternate; the figure is the median over blocks of ms per drafted
token. Models: the tiny Llama draft of ``edgespec.cloud.training.tiny`` and a 1-layer Llama with
hidden 128 and vocabulary 4096 (random init).

    .venv/bin/python lab/bench_draft.py [--context 200] [--k 4] [--rounds 50] [--blocks 5] [--model DIR]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig, LlamaForCausalLM
from transformers.utils import logging as hf_logging

from edgespec.cloud.training.export import export_draft
from edgespec.cloud.training.tiny import build_tiny_pair, corpus_text, save_tokenizer, train_tokenizer
from edgespec.edge.draft import DraftModel


def build_llama_128(out: Path, vocab_size: int = 4096) -> Path:
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=512, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=0, pad_token_id=0,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).eval().save_pretrained(str(out))
    save_tokenizer(train_tokenizer(corpus_text(), vocab_size), out)
    return out


def ort_block(draft: DraftModel, context: list[int], k: int, rounds: int) -> float:
    """ms per drafted token; each round drafts k tokens then rolls back to the same state."""
    draft.reset(context)
    draft.propose(1)  # prefill outside the timing
    draft.rollback_to(len(context) - 1)
    draft.append(context[-1:])
    started = time.perf_counter()
    for _ in range(rounds):
        draft.propose(k)
        draft.rollback_to(len(context) - 1)
        draft.append(context[-1:])
    return (time.perf_counter() - started) * 1e3 / (rounds * k)


def torch_block(model, context: list[int], k: int, rounds: int) -> float:
    with torch.no_grad():
        cache = model(input_ids=torch.tensor([context[:-1]]), cache=DynamicCache(), use_cache=True).cache
        started = time.perf_counter()
        for _ in range(rounds):
            chunk = context[-1:]
            for _ in range(k):
                out = model(input_ids=torch.tensor([chunk]), cache=cache, use_cache=True)
                cache = out.cache
                chunk = [int(out.logits[0, -1].argmax())]
            cache.crop(-k)  # drop the k fed tokens: back to context[:-1]
    return (time.perf_counter() - started) * 1e3 / (rounds * k)


def bench(name: str, hf_dir: Path, out: Path, args: argparse.Namespace) -> None:
    report = export_draft(hf_dir, out, log=lambda _: None)
    draft = DraftModel(out, threads=1)
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir)).eval()
    rng = np.random.default_rng(0)
    context = rng.integers(1, draft.vocab_size, args.context).tolist()
    params = sum(p.numel() for p in model.parameters())
    ort_ms, torch_ms = [], []
    ort_block(draft, context, args.k, 5)  # warm-up
    torch_block(model, context, args.k, 5)
    for _ in range(args.blocks):
        ort_ms.append(ort_block(draft, context, args.k, args.rounds))
        torch_ms.append(torch_block(model, context, args.k, args.rounds))
    o, t = statistics.median(ort_ms), statistics.median(torch_ms)
    print(
        f"{name:<28} {params / 1e6:6.2f}M params  vocab {draft.vocab_size:5d}  ctx {args.context}  "
        f"ORT {o:6.3f} ms/token  torch {t:6.3f} ms/token  torch/ORT {t / o:4.1f}x  "
        f"(parity {report.manifest.parity_max_abs_diff:.1e})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--model", type=Path, action="append", default=[],
                        help="also a Hugging Face draft directory (repeatable), e.g. models/demo/draft-hf")
    args = parser.parse_args()
    torch.set_num_threads(1)
    hf_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        bench("tiny Llama draft (1L, h64)", build_tiny_pair(root / "pair").draft_dir, root / "tiny-onnx", args)
        bench("Llama 1L h128 v4096", build_llama_128(root / "llama128"), root / "llama128-onnx", args)
        for i, model_dir in enumerate(args.model):
            bench(str(model_dir), model_dir, root / f"model-{i}-onnx", args)


if __name__ == "__main__":
    main()
