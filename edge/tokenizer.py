"""Tokenizer loading and fingerprinting, shared by the edge and the cloud.

Draft and target must tokenize identically, or every verdict is about the wrong text.
Both sides compute a fingerprint of the tokenizer (a hash of its model: vocabulary,
merges, added tokens, and the pre-tokenizer/normalizer that decide how text is cut);
the server refuses a session whose fingerprint differs from its own.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tokenizers import Tokenizer

TOKENIZER_FILE = "tokenizer.json"


def load_tokenizer(model_dir: str | Path) -> Tokenizer:
    """Loads ``tokenizer.json`` from a model directory."""
    path = Path(model_dir) / TOKENIZER_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: a model directory must hold a fast-tokenizer file "
            f"'{TOKENIZER_FILE}' (save it with tokenizer.save_pretrained(dir) or "
            f"`edgespec export-draft`)"
        )
    return Tokenizer.from_file(str(path))


def fingerprint(tokenizer: Tokenizer) -> str:
    """A stable identifier of how ``tokenizer`` maps text to ids.

    Hashes the canonical JSON of the parts that decide the mapping, so cosmetic
    differences (padding/truncation settings, file formatting) do not matter.
    """
    spec = json.loads(tokenizer.to_str())
    relevant = {
        "model": spec.get("model"),
        "added_tokens": [
            {"id": t["id"], "content": t["content"], "special": t.get("special", False)}
            for t in spec.get("added_tokens") or []
        ],
        "normalizer": spec.get("normalizer"),
        "pre_tokenizer": spec.get("pre_tokenizer"),
    }
    canonical = json.dumps(relevant, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]
    kind = (spec.get("model") or {}).get("type", "unknown").lower()
    return f"{kind}-{tokenizer.get_vocab_size(with_added_tokens=True)}-{digest}"
