"""Feeding the exported draft graph: the one place that knows its inputs and outputs.

``DraftModel`` (the device) and the export's parity check (``edgespec.cloud.training.export``)
both run the graph through ``run_graph``; the feeds follow ``manifest.json``
(``edgespec.edge.manifest``): ids and absolute position ids [1, n] int64, then the past keys
and values [1, kv_heads, past, head_dim], an empty past (length 0) on the first call.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Sequence

import numpy as np
import onnxruntime as ort

from edgespec.edge.errors import DraftIntegrityError
from edgespec.edge.manifest import DraftManifest

DEFAULT_PROVIDERS = ("CPUExecutionProvider",)


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_graph_files(model_dir: str | Path, manifest: DraftManifest) -> None:
    """Raises ``DraftIntegrityError`` unless the graph and its external data hash as the manifest
    records (manifests before format 3 record no hash: nothing to check)."""
    model_dir = Path(model_dir)
    expected = {manifest.onnx_file: manifest.onnx_sha256} if manifest.onnx_sha256 else {}
    expected.update(manifest.external_data)
    for name, digest in expected.items():
        path = model_dir / name
        if not path.is_file():
            raise DraftIntegrityError(f"{path} is missing; the draft directory is incomplete: re-export or re-download it")
        actual = sha256_file(path)
        if actual != digest:
            raise DraftIntegrityError(
                f"{path} has sha256 {actual[:16]}..., but manifest.json records {digest[:16]}...: the graph was "
                f"modified or comes from another export; re-export or re-download the draft"
            )


def check_providers(providers) -> list[str]:
    """``providers`` (names, in priority order) if this onnxruntime build has them all; else a
    ValueError naming the available ones. None: the CPU provider."""
    if providers is None:
        return list(DEFAULT_PROVIDERS)
    if isinstance(providers, str):
        providers = [providers]
    names = [p[0] if isinstance(p, tuple) else p for p in providers]
    available = ort.get_available_providers()
    unknown = [name for name in names if name not in available]
    if unknown or not names:
        raise ValueError(f"execution provider(s) {unknown or names} not available in this onnxruntime; available: {', '.join(available)}")
    return list(providers)


def open_session(path: str | Path, *, threads: int = 1, providers: Sequence[str] | None = None) -> ort.InferenceSession:
    """An ONNX Runtime session for a draft graph; ``threads`` 0 lets ORT choose."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=check_providers(providers))


def empty_past(manifest: DraftManifest) -> list[np.ndarray]:
    """The cache of an empty context: one [1, kv_heads, 0, head_dim] array per past input."""
    shape = (1, manifest.num_kv_heads, 0, manifest.head_dim)
    return [np.zeros(shape, np.dtype(manifest.kv_dtype)) for _ in manifest.past_inputs]


def run_graph(
    session: ort.InferenceSession, manifest: DraftManifest, ids: list[int], start: int, past: list[np.ndarray]
) -> tuple[np.ndarray, list[np.ndarray]]:
    """One forward over ``ids`` at positions start.. against ``past``; returns (logits [n, V], present)."""
    feeds = {
        manifest.ids_input: np.asarray(ids, dtype=np.int64)[None],  # [1, n]
        manifest.positions_input: np.arange(start, start + len(ids), dtype=np.int64)[None],  # [1, n]
    }
    # Rolled-back caches are strided views; ONNX Runtime wants contiguous buffers.
    feeds.update((name, np.ascontiguousarray(kv)) for name, kv in zip(manifest.past_inputs, past))
    logits, *present = session.run(manifest.output_names, feeds)
    return np.asarray(logits)[0], [np.asarray(kv) for kv in present]


class GraphRunner:
    """Feeds chunks of one context through the graph, carrying its cache between calls."""

    def __init__(self, session: ort.InferenceSession, manifest: DraftManifest):
        self.session, self.manifest = session, manifest
        self.past = empty_past(manifest)
        self.length = 0

    def feed(self, ids: list[int]) -> np.ndarray:
        """Logits [len(ids), V] for the next ``ids``; the cache grows by them."""
        logits, self.past = run_graph(self.session, self.manifest, ids, self.length, self.past)
        self.length += len(ids)
        return logits
