"""The device refuses a draft graph that is not the one its manifest was written for, and an
ONNX Runtime execution provider this build lacks (naming the available ones)."""

from __future__ import annotations

import shutil

import onnxruntime as ort
import pytest
from helpers import REPO

from edgespec.edge.draft import DraftModel
from edgespec.edge.errors import DraftIntegrityError, EdgespecError
from edgespec.edge.manifest import DraftManifest

DEMO = REPO / "models" / "demo" / "draft"


def test_the_shipped_draft_records_its_graph_hash_and_loads():
    assert len(DraftManifest.load(DEMO).onnx_sha256) == 64
    DraftModel(DEMO)


def test_a_tampered_graph_is_refused(tmp_path):
    draft = tmp_path / "draft"
    shutil.copytree(DEMO, draft)
    graph = draft / "model.onnx"
    data = bytearray(graph.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit of one weight
    graph.write_bytes(bytes(data))
    with pytest.raises(DraftIntegrityError, match="sha256") as info:
        DraftModel(draft)
    assert isinstance(info.value, EdgespecError) and "re-export" in str(info.value)


def test_cpu_is_the_default_provider_and_an_unknown_one_is_refused():
    assert DraftModel(DEMO).session.get_providers() == ["CPUExecutionProvider"]
    assert DraftModel(DEMO, providers=["CPUExecutionProvider"]).session.get_providers() == ["CPUExecutionProvider"]
    with pytest.raises(ValueError, match="NoSuchExecutionProvider") as info:
        DraftModel(DEMO, providers=["NoSuchExecutionProvider"])
    for name in ort.get_available_providers():
        assert name in str(info.value)


def test_the_cli_refuses_an_unknown_execution_provider(capsys):
    from edgespec.cli import main

    code = main(["generate", "--server", "127.0.0.1:1", "--draft", str(DEMO), "--execution-provider", "NoSuchExecutionProvider", "--prompt", "x"])
    assert code == 1
    err = capsys.readouterr().err
    assert "NoSuchExecutionProvider" in err and "CPUExecutionProvider" in err
