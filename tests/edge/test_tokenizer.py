"""The tokenizer fingerprint, scheme tok1: RFC 8785 canonical JSON of the parts that decide the
mapping, SHA-256; the test vectors documented in docs/protocol.md."""

from __future__ import annotations

import json
import re

import pytest
from helpers import REPO

from edgespec.edge.tokenizer import canonical_json, fingerprint, is_current_scheme, legacy_fingerprint, load_tokenizer

VECTORS = REPO / "docs" / "fingerprint"


def documented_vectors() -> dict[str, str]:
    text = (REPO / "docs" / "protocol.md").read_text()
    return dict(re.findall(r"\| `(\w+\.tokenizer\.json)` \| `(tok1-[\w-]+)` \|", text))


def test_the_documented_vectors_hold():
    vectors = documented_vectors()
    assert len(vectors) == 2
    for name, expected in vectors.items():
        assert fingerprint(VECTORS / name) == expected


def test_the_documented_canonical_form_is_what_is_hashed():
    text = (REPO / "docs" / "protocol.md").read_text()
    documented = re.search(r"The canonical form of the first:\n\n```\n(.*)\n```", text).group(1)
    spec = json.loads((VECTORS / "bpe.tokenizer.json").read_text())
    relevant = {"model": {**spec["model"], "merges": [["a", "b"]]}, "added_tokens": [{"id": 0, "content": "<s>", "special": True}],
                "normalizer": None, "pre_tokenizer": spec["pre_tokenizer"]}
    assert canonical_json(relevant) == documented


@pytest.mark.parametrize("value, text", [
    (1.0, "1"), (0.5, "0.5"), (1e-7, "1e-7"), (1.5e-5, "0.000015"), (1e21, "1e+21"), (1e20, "100000000000000000000"),
    (-2.25e-7, "-2.25e-7"), (123.456, "123.456"), (5e-324, "5e-324"), (0.0, "0"), (-0.0, "0"), (2**60, "1152921504606847000"),
])
def test_numbers_are_written_as_ecmascript_does(value, text):
    assert canonical_json(value) == text


def test_keys_sort_by_utf16_code_units_and_strings_escape_minimally():
    # U+FF01 sorts after U+1F600 in UTF-16 (a surrogate pair starts 0xD83D), before it by code point.
    assert canonical_json({"\uff01": 1, "\U0001f600": 2, "a": "é\n\"\x01"}) == '{"a":"é\\n\\"\\u0001","😀":2,"！":1}'


def test_a_file_its_directory_and_the_loaded_tokenizer_agree(tmp_path):
    source = VECTORS / "bpe.tokenizer.json"
    (tmp_path / "tokenizer.json").write_bytes(source.read_bytes())
    assert fingerprint(source) == fingerprint(tmp_path) == fingerprint(load_tokenizer(tmp_path))
    # Merges as pairs (newer tokenizers files) or as "a b" strings (older ones): one fingerprint.
    spec = json.loads(source.read_text())
    spec["model"]["merges"] = [["a", "b"]]
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec, indent=2))
    assert fingerprint(tmp_path) == fingerprint(source)


def test_anything_that_changes_the_mapping_changes_it(tmp_path):
    spec = json.loads((VECTORS / "bpe.tokenizer.json").read_text())
    base = fingerprint(VECTORS / "bpe.tokenizer.json")
    for change in (lambda s: s["model"]["vocab"].update({"ba": 5}), lambda s: s["model"]["merges"].append("b a"),
                   lambda s: s["added_tokens"][0].update(special=False), lambda s: s.update(normalizer={"type": "NFC"})):
        changed = json.loads(json.dumps(spec))
        change(changed)
        (tmp_path / "tokenizer.json").write_text(json.dumps(changed))
        assert fingerprint(tmp_path) != base
    spec["padding"] = {"strategy": "BatchLongest"}  # cosmetic: not part of the mapping
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    assert fingerprint(tmp_path) == base


def test_the_older_scheme_is_recognised():
    tokenizer = load_tokenizer(REPO / "models" / "demo" / "target")
    old = legacy_fingerprint(tokenizer)
    assert not is_current_scheme(old) and is_current_scheme(fingerprint(tokenizer))
    assert old.split("-")[-1] == fingerprint(tokenizer).split("-")[-1]  # this BPE file: the same canonical bytes


def test_a_second_implementation_in_javascript_agrees():
    """docs/fingerprint/fingerprint.js (plain Node.js) computes the same fingerprints."""
    import shutil
    import subprocess

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the JavaScript implementation cannot be run here")
    for path in (VECTORS / "bpe.tokenizer.json", VECTORS / "unigram.tokenizer.json", REPO / "models" / "demo" / "target" / "tokenizer.json"):
        out = subprocess.run([node, str(VECTORS / "fingerprint.js"), str(path)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == fingerprint(path)
