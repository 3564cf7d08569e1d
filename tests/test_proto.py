"""The generated code matches the .proto files (regenerate with `make proto`)."""

from __future__ import annotations

import filecmp
import importlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_generated_code_is_fresh(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--out", str(tmp_path)], check=True, capture_output=True)
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert generated, "the generator wrote nothing"
    stale = [str(rel) for rel in generated if not filecmp.cmp(tmp_path / rel, ROOT / "proto" / rel, shallow=False)]
    assert not stale, f"generated code is stale, run `make proto`: {stale}"


def test_nothing_is_importable_as_proto():
    # proto-plus (pulled in by Ray) owns the top-level name `proto`.
    spec = importlib.util.find_spec("proto")
    assert spec is None or "proto_plus" in str(spec.origin) or "site-packages" in str(spec.origin)


def test_contract_has_the_three_rpcs():
    from edgespec.v1 import speculative_pb2 as pb

    service = pb.DESCRIPTOR.services_by_name["Speculative"]
    methods = {m.name: (m.client_streaming, m.server_streaming) for m in service.methods}
    assert methods == {"Session": (True, True), "Generate": (False, True), "Info": (False, False)}
