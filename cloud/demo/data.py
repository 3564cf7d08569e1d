"""Stage 1 of the demo: split the corpus, train the tokenizer, encode the splits, cut prompts.

Everything lands in one data directory::

    manifest.json        Python version, split rules, every file with its split and sha256
    tokenizer/           tokenizer.json (+ transformers wrapper files), trained on train only
    train.bin, validation.bin, heldout.bin   uint16 token ids, files joined by <|endoftext|>
    heldout.jsonl, tuning.jsonl              prompts (held-out files / validation files)

The ``.bin`` files are flat so a batch is a few random slices
(see :class:`edgespec.cloud.training.data.TokenStream`).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from edgespec.cloud.training.corpus import (
    SPLITS,
    SplitFractions,
    list_corpus,
    python_version,
    read_source,
    split_digest,
    stdlib_root,
)
from edgespec.cloud.demo.prompts import PromptSpec, cut_prompts
from edgespec.cloud.training.tiny import EOS_TOKEN, save_tokenizer, train_tokenizer
from edgespec.edge.tokenizer import fingerprint, load_tokenizer

EOS_ID = 0  # train_tokenizer puts <|endoftext|> first
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class DataConfig:
    out_dir: Path
    root: Path | None = None  # the stdlib by default; tests point it at a small fake tree
    vocab_size: int = 4096
    fractions: SplitFractions = field(default_factory=SplitFractions)
    max_file_bytes: int = 400_000
    heldout_prompts: PromptSpec = field(default_factory=lambda: PromptSpec(count=64, seed=0))
    tuning_prompts: PromptSpec = field(default_factory=lambda: PromptSpec(count=64, seed=1))

    def __post_init__(self) -> None:
        object.__setattr__(self, "out_dir", Path(self.out_dir))
        if self.root is not None:
            object.__setattr__(self, "root", Path(self.root))
            if not self.root.is_dir():
                raise ValueError(f"root: {self.root} is not a directory")
        if not 256 < self.vocab_size <= 65535:
            # uint16 token files; a byte-level BPE needs the 256 byte symbols plus merges
            raise ValueError(f"vocab_size must be in (256, 65535], got {self.vocab_size}")
        if self.max_file_bytes < 1:
            raise ValueError(f"max_file_bytes must be >= 1, got {self.max_file_bytes}")


def is_prepared(out_dir: Path) -> bool:
    out_dir = Path(out_dir)
    return all((out_dir / name).is_file() for name in (MANIFEST, "train.bin", "heldout.jsonl", "tokenizer/tokenizer.json"))


def _encode_split(texts: list[str], tokenizer, desc: str) -> np.ndarray:
    chunks = []
    for text in tqdm(texts, desc=f"encode {desc}", unit="file", mininterval=5):
        chunks.append(np.asarray(tokenizer.encode(text).ids + [EOS_ID], dtype=np.uint16))
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.uint16)


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def prepare_data(config: DataConfig) -> dict:
    """Runs the data stage; returns the manifest (also written to ``out_dir/manifest.json``)."""
    out = config.out_dir
    out.mkdir(parents=True, exist_ok=True)
    root = stdlib_root() if config.root is None else config.root
    files = list_corpus(root, fractions=config.fractions, max_file_bytes=config.max_file_bytes)
    texts = {f.relpath: read_source(root / f.relpath) for f in files}
    by_split = {s: [f.relpath for f in files if f.split == s] for s in SPLITS}

    print(f"corpus: {len(files)} files from {root} (Python {python_version()}): "
          + ", ".join(f"{s} {len(by_split[s])}" for s in SPLITS), flush=True)
    tokenizer = train_tokenizer([texts[p] for p in by_split["train"]], config.vocab_size)
    if tokenizer.token_to_id(EOS_TOKEN) != EOS_ID:
        raise RuntimeError(f"{EOS_TOKEN} must have id {EOS_ID}")
    save_tokenizer(tokenizer, out / "tokenizer")
    tokenizer = load_tokenizer(out / "tokenizer")  # what every later stage will load

    counts = {}
    for split in SPLITS:
        ids = _encode_split([texts[p] for p in by_split[split]], tokenizer, split)
        ids.tofile(out / f"{split}.bin")
        counts[split] = int(ids.size)

    heldout = cut_prompts({p: texts[p] for p in by_split["heldout"]}, tokenizer, config.heldout_prompts, "heldout")
    tuning = cut_prompts({p: texts[p] for p in by_split["validation"]}, tokenizer, config.tuning_prompts, "tuning")
    _write_jsonl(out / "heldout.jsonl", [p.to_json() for p in heldout])
    _write_jsonl(out / "tuning.jsonl", [p.to_json() for p in tuning])

    manifest = {
        "python_version": python_version(),
        "stdlib_root": str(root),
        "split_rule": "sha256(relpath)[:8] as big-endian int % 100: < heldout% -> heldout, "
        "< heldout%+validation% -> validation, else train",
        "fractions": asdict(config.fractions),
        "max_file_bytes": config.max_file_bytes,
        "split_digest": split_digest(files),
        "tokenizer_fingerprint": fingerprint(tokenizer),
        "vocab_size": tokenizer.get_vocab_size(),
        "tokens": counts,
        "bytes": {s: sum(f.n_bytes for f in files if f.split == s) for s in SPLITS},
        "prompts": {"heldout": asdict(config.heldout_prompts), "tuning": asdict(config.tuning_prompts)},
        "files": [asdict(f) for f in files],
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"tokens: {counts}; tokenizer {manifest['tokenizer_fingerprint']}", flush=True)
    return manifest


def copy_prompts(data_dir: Path, prompts_dir: Path) -> None:
    """Copies the prompt files and the split manifest into the repository's ``prompts/``."""
    prompts_dir.mkdir(parents=True, exist_ok=True)
    for name in ("heldout.jsonl", "tuning.jsonl"):
        shutil.copyfile(Path(data_dir) / name, prompts_dir / name)
    shutil.copyfile(Path(data_dir) / MANIFEST, prompts_dir / "stdlib-split.json")
