"""The draft manifest, format 2: its graph section describes the ONNX graph exactly, validates
against docs/manifest.schema.json, and format 1 manifests still load (described the same way)."""

from __future__ import annotations

import json

import pytest
from helpers import REPO

from edgespec.edge.manifest import FORMAT_VERSION, MANIFEST_FILE, DraftManifest

DEMO = REPO / "models" / "demo" / "draft"


@pytest.fixture(scope="module")
def schema():
    return json.loads((REPO / "docs" / "manifest.schema.json").read_text())


def test_the_shipped_manifest_follows_the_schema(schema):
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(json.loads((DEMO / MANIFEST_FILE).read_text()), schema)


def test_the_graph_section_is_the_onnx_graph():
    import onnxruntime as ort

    manifest = DraftManifest.load(DEMO)
    session = ort.InferenceSession(str(DEMO / manifest.onnx_file), providers=["CPUExecutionProvider"])
    types = {"tensor(int64)": "int64", "tensor(float)": "float32", "tensor(float16)": "float16"}
    for described, actual in ((manifest.graph["inputs"], session.get_inputs()), (manifest.graph["outputs"], session.get_outputs())):
        assert [t["name"] for t in described] == [a.name for a in actual]
        for tensor, node in zip(described, actual):
            assert tensor["dtype"] == types[node.type] and len(tensor["shape"]) == len(node.shape)
            fixed = [(d, a) for d, a in zip(tensor["shape"], node.shape) if isinstance(d, int) and isinstance(a, int)]
            assert all(d == a for d, a in fixed), (tensor, node.shape)


def test_a_format_1_manifest_loads_and_saves_as_the_current_format(tmp_path, schema):
    data = json.loads((DEMO / MANIFEST_FILE).read_text())
    for name in ("graph", "onnx_sha256", "external_data", "target", "parity", "quantization", "draft_vocab_size"):
        data.pop(name)  # what format 1 did not have
    data["format_version"] = 1
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(data))
    manifest = DraftManifest.load(tmp_path)
    assert manifest.format_version == FORMAT_VERSION and manifest.graph == DraftManifest.load(DEMO).graph
    assert manifest.onnx_sha256 == ""  # older formats record no hash: nothing to check
    manifest.save(tmp_path)
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(json.loads((tmp_path / MANIFEST_FILE).read_text()), schema)


def test_a_graph_edited_by_hand_is_refused(tmp_path):
    data = json.loads((DEMO / MANIFEST_FILE).read_text())
    data["graph"]["inputs"][0]["dtype"] = "int32"
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(data))
    with pytest.raises(ValueError, match="graph does not match"):
        DraftManifest.load(tmp_path)
