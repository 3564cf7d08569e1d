"""Feeding the exported draft graph: the one place that knows its inputs and outputs.

``DraftModel`` (the device) and the export's parity check (``edgespec.cloud.training.export``)
both run the graph through ``run_graph``; the feeds follow ``manifest.json``
(``edgespec.edge.manifest``): ids and absolute position ids [1, n] int64, then the past keys
and values [1, kv_heads, past, head_dim], an empty past (length 0) on the first call.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from edgespec.edge.manifest import DraftManifest


def open_session(path: str | Path, *, threads: int = 1, providers: list[str] | None = None) -> ort.InferenceSession:
    """An ONNX Runtime session for a draft graph; ``threads`` 0 lets ORT choose."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=providers or ["CPUExecutionProvider"])


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
    return logits[0], present


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
