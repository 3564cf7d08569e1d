"""The generated code matches the .proto files (regenerate with `make proto`)."""

from __future__ import annotations

import filecmp
import importlib
import subprocess
import sys

from helpers import REPO



def test_generated_code_is_fresh(tmp_path):
    subprocess.run([sys.executable, str(REPO / "scripts" / "gen_proto.py"), "--out", str(tmp_path)], check=True, capture_output=True)
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert generated, "the generator wrote nothing"
    stale = [str(rel) for rel in generated if not filecmp.cmp(tmp_path / rel, REPO / "proto" / rel, shallow=False)]
    assert not stale, f"generated code is stale, run `make proto`: {stale}"


def test_nothing_of_ours_is_importable_as_proto():
    # proto-plus (pulled in by Ray) owns the top-level name `proto`: if `proto` imports at all,
    # it must be proto-plus's own file, never this repository's proto/ folder.
    assert not (REPO / "proto" / "__init__.py").exists()
    spec = importlib.util.find_spec("proto")
    if spec is not None:
        from importlib.metadata import distribution

        owner = distribution("proto-plus")
        files = {str(owner.locate_file(f)) for f in owner.files or []}
        assert spec.origin in files, f"`proto` resolves to {spec.origin}, not to proto-plus"


def test_contract_has_the_three_rpcs():
    from edgespec.v1 import speculative_pb2 as pb

    service = pb.DESCRIPTOR.services_by_name["Speculative"]
    methods = {m.name: (m.client_streaming, m.server_streaming) for m in service.methods}
    assert methods == {"Session": (True, True), "Generate": (False, True), "Info": (False, False)}
