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


SCHEME = "tok1"  # the fingerprint scheme: docs/protocol.md "Tokenizer fingerprint"


def fingerprint(source: "Tokenizer | str | Path") -> str:
    """A stable, language-neutral identifier of how a tokenizer maps text to ids.

    ``source``: a model directory or a ``tokenizer.json`` path (the file's JSON is what is
    hashed), or a loaded ``Tokenizer`` (its serialisation, the same JSON when the file was
    written by this tokenizers library). Scheme ``tok1`` (docs/protocol.md): the parts that
    decide the mapping (``model``, ``added_tokens`` as id/content/special, ``normalizer``,
    ``pre_tokenizer``; BPE merges written as "a b" strings become ["a", "b"] pairs) are
    serialised with the JSON Canonicalization Scheme (RFC 8785) and hashed with SHA-256:
    ``tok1-<model type>-<vocabulary size incl. added tokens>-<first 16 hex digits>``.
    """
    spec = _spec(source)
    relevant = {
        "model": _normalised_model(spec.get("model")),
        "added_tokens": [
            {"id": t["id"], "content": t["content"], "special": bool(t.get("special", False))}
            for t in spec.get("added_tokens") or []
        ],
        "normalizer": spec.get("normalizer"),
        "pre_tokenizer": spec.get("pre_tokenizer"),
    }
    digest = hashlib.sha256(canonical_json(relevant).encode("utf-8")).hexdigest()[:16]
    model = spec.get("model") or {}
    return f"{SCHEME}-{str(model.get('type', 'unknown')).lower()}-{vocabulary_size(spec)}-{digest}"


def legacy_fingerprint(tokenizer: Tokenizer) -> str:
    """The fingerprint of edgespec before scheme ``tok1`` (Python's json.dumps of the same parts,
    as ``<type>-<vocab>-<16 hex>``): only to recognise drafts exported back then."""
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


def is_current_scheme(value: str) -> bool:
    return value.startswith(SCHEME + "-")


def _spec(source) -> dict:
    if isinstance(source, Tokenizer):
        return json.loads(source.to_str())
    path = Path(source)
    if path.is_dir():
        path = path / TOKENIZER_FILE
    return json.loads(path.read_text(encoding="utf-8"))


def _normalised_model(model):
    if not isinstance(model, dict) or not isinstance(model.get("merges"), list):
        return model
    merges = [m.split(" ", 1) if isinstance(m, str) else m for m in model["merges"]]
    return {**model, "merges": merges}


def vocabulary_size(spec: dict) -> int:
    """Distinct ids of the model's vocabulary and the added tokens."""
    model = spec.get("model") or {}
    vocab = model.get("vocab")
    if isinstance(vocab, dict):
        ids = set(vocab.values())
    elif isinstance(vocab, list):  # Unigram: [piece, score] in id order
        ids = set(range(len(vocab)))
    else:
        ids = set()
    ids.update(t["id"] for t in spec.get("added_tokens") or [])
    return len(ids)


def canonical_json(value) -> str:
    """RFC 8785 (JSON Canonicalization Scheme): sorted keys (by UTF-16 code units), no
    whitespace, ECMAScript number formatting, minimal string escapes."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value) if abs(value) <= 2**53 else _es_number(float(value))
    if isinstance(value, float):
        return _es_number(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(canonical_json(v) for v in value) + "]"
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: k.encode("utf-16-be"))
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + canonical_json(value[k]) for k in keys) + "}"
    raise TypeError(f"not JSON: {type(value).__name__}")


def _es_number(x: float) -> str:
    """ECMAScript's Number::toString for a finite double (what RFC 8785 prescribes)."""
    import math
    from decimal import Decimal

    if not math.isfinite(x):
        raise ValueError("JSON has no NaN or infinity")
    if x == 0:
        return "0"
    sign = "-" if x < 0 else ""
    digits_tuple = Decimal(repr(abs(x))).normalize().as_tuple()  # repr: the shortest round-trip digits
    digits = "".join(map(str, digits_tuple.digits))
    k = len(digits)
    exponent = digits_tuple.exponent
    assert isinstance(exponent, int)  # a finite x has a numeric exponent
    n = exponent + k  # x = 0.digits x 10^n
    if k <= n <= 21:
        out = digits + "0" * (n - k)
    elif 0 < n <= 21:
        out = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        out = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        mantissa = digits if k == 1 else digits[0] + "." + digits[1:]
        out = f"{mantissa}e{'+' if e >= 0 else '-'}{abs(e)}"
    return sign + out
