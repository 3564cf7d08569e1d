"""What the simulator needs to know about a draft/target pair and its servers, loadable from JSON.

Every number here comes from a measurement (``edgespec bench``, ``scripts/bench_verify.py``,
the server's Prometheus metrics) or is a placeholder. ``Calibration.default()`` is entirely
placeholder: plausible for a mid-size target on one GPU and a ~7M-parameter ONNX draft, and
marked as such in its ``source`` field, which every result carries.

JSON schema (all times in milliseconds, all sizes in bytes; omitted keys take the defaults)::

    {
      "source": "free text: where these numbers come from",
      "draft_ms_per_token": 1.3,        # device: one draft forward (ONNX Runtime)
      "draft_cv": 0.1,                  # coefficient of variation of a round's drafting time
      "acceptance": [0.8, 0.74, 0.7],   # per position i: P(accept i | all before i accepted);
                                        # positions past the end repeat the last value
      "verify": {"a_ms": 20.0, "b_ms": 0.5, "c_ms": 0.08},
                # replica time of one batched forward + accept rule:
                #   a_ms + b_ms * batch + c_ms * batch * tokens_per_row
                # or a measured table, bilinear in (batch, tokens per row), extrapolated
                # linearly past its edges:
                # {"batch": [1, 8, 32], "tokens_per_row": [1, 5, 9], "ms": [[...], [...], [...]]}
      "ingress_ms_per_round_message": 1.45,   # service time of one Session-stream message
                                        # (Open, Opened, Draft, Verdict, Close, Closed) at the
                                        # replica's ingress queue (see "The ingress" below)
      "ingress_ms_per_stream_message": 1.0,   # the same for one Generate message (the
                                        # request, each streamed token)
      "round_overhead_ms": 0.0,         # non-queueing remainder per speculative round
      "round_overhead_by_link_ms": {"wifi": 2.5},  # added to it on that link profile (see
                                        # "Per-link fixed cost" below); links not named add 0
      "stream_overhead_ms": 0.0,        # non-queueing remainder per Generate token
      "prefill_ms": 10.0,               # opening a session: prompt prefill, queued on the model
                                        # thread with the forwards, both paths
      "open_overhead_ms": 0.0,          # opening a session or a Generate call: its latency
                                        # outside the model thread and the ingress queue (the
                                        # call's setup, admission); paid in parallel
      "up_bytes_base": 40,              # Draft message framing (HTTP/2 + gRPC + protobuf)
      "up_bytes_per_draft": 3,          # per draft token (varint ids; far more with exact-mode q)
      "down_bytes_per_round": 40,       # Verdict message
      "open_bytes": 400,                # Open / GenerateRequest (prompt ids)
      "down_bytes_per_token": 30        # one Generate response message
    }

Terms: a **row** is one session's block in a batch; **tokens per row** is k + 1 for a
speculative round (pending token + k drafts) and 1 for a cloud-only decode step; rows in a
batch are padded to the longest, so a batch costs its longest row.

The ingress
-----------

Every message between a device and its replica costs CPU outside the target forward: Serve's
gRPC proxy, the replica's Python I/O (decode, validate, encode, yield). That work is done by
processes every session of the replica shares, so with many sessions it queues. The model is
one FIFO single server per replica: each message occupies it for its service time, in arrival
order, whatever session it belongs to. A speculative round is two messages (Draft in, Verdict
out), a session adds four (Open, Opened, Close, Closed); a Generate call is its request plus
one message per token; the streams of a decoding batch resume together once it ends, and each
queues its next step as its token's message leaves (the generator resumes right after its
yield). So, with service time s:

- one session, no network: round = draft + s + verify(1, k + 1) + s + ``round_overhead_ms``;
  cloud-only token = verify(1, 1) + s + ``stream_overhead_ms``;
- N sessions: at most 1 / (2 s) rounds/s, or 1 / s Generate tokens/s, per replica.

``round_overhead_ms`` and ``stream_overhead_ms`` are the non-queueing remainder (a pure
latency per round / per token); with the ingress given they default to 0. Old files that set
an overhead but no ingress time (written before the ingress existed) load with that kind's
ingress at 0, so they simulate the fixed latency they were measured as.

**Calibrating** (``cloud/bench/calibrate.py``, run by ``edgespec bench simcheck``; never fit
these to the multi-session runs of real drafts, which are what the model must predict):

- the round's overhead outside the forward, from raw single-session rounds (the forward time
  the replica reports in each verdict taken out), is split into ``ingress_ms_per_round_message``
  (two messages' service) and ``round_overhead_ms`` (latency) by a loaded replica: N raw
  sessions of random drafts, and the split under which the simulator gives their round time;
  the real client's own time per round (its round overhead beyond the raw one) is latency too;
- ``ingress_ms_per_stream_message`` and ``stream_overhead_ms`` from raw Generate streams,
  one alone and N at once: a reply comes every step(b) + ``stream_overhead_ms`` + b *
  ``ingress_ms_per_stream_message`` when b streams decode together, and each reply carries
  the step behind it (``GenerateResponse.step_ms``), so the gaps less their steps give both
  (``split_stream_ingress``); the decode step at each batch size, the 1-token column of
  ``verify``, from the same replies (``GenerateResponse.batch_size``);
- the load moves all of these from minute to minute on shared cores: ``edgespec bench
  simcheck`` reads them again around every group of cells (``cloud/bench/probe.py``).

Two service times are kept: the two kinds run different code (a bidi stream's request/reply
pair vs a server-streaming generator's yield), and measured apart they differ (on the demo
pair ~0.2-0.3 ms per streamed token against ~0.7-1 ms per round message).
A single session cannot tell queueing work from pure latency; a loaded replica can: on the
2-core rig 35-80% of a raw round's ~3 ms overhead behaves as queueing work (0.59 and 1.19 ms
per message in two runs), the replica's event loop doing it for every session in turn.

Per-link fixed cost
-------------------

A link adds more to a round than its modelled delay: the link emulator's own timers, its
event loop and its CPU on the shared cores (``edgespec link``), a real path's middleboxes.
``round_overhead_by_link_ms[name]`` is that remainder for the link profile ``name``, one
measured round each (``cloud/bench/calibrate.py``, ``link_round_overheads``): the median
overhead of raw single-session rounds through that link, less the same rounds' overhead
without it, less the median round-trip delay the profile itself models. It is pure latency
(it does not queue), and 0 for a link that was not measured.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class VerifyModel:
    """Replica milliseconds for one batched forward: linear, or a measured table when one is given.

    Attributes:
        a_ms, b_ms, c_ms: ``a_ms + b_ms * batch + c_ms * batch * tokens_per_row``.
        batch, tokens_per_row: the table's axes (strictly increasing, >= 1).
        ms: ``ms[i][j]`` for ``batch[i]`` rows of ``tokens_per_row[j]`` tokens.
    """

    a_ms: float = 20.0
    b_ms: float = 0.5
    c_ms: float = 0.08
    batch: tuple[int, ...] = ()
    tokens_per_row: tuple[int, ...] = ()
    ms: tuple[tuple[float, ...], ...] = ()
    _looked_up: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # table: (batch, tokens) -> ms

    def __post_init__(self) -> None:
        for name in ("a_ms", "b_ms", "c_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"verify.{name} must be >= 0, got {getattr(self, name)}")
        object.__setattr__(self, "batch", tuple(int(b) for b in self.batch))
        object.__setattr__(self, "tokens_per_row", tuple(int(t) for t in self.tokens_per_row))
        object.__setattr__(self, "ms", tuple(tuple(float(v) for v in row) for row in self.ms))
        if not (self.batch or self.tokens_per_row or self.ms):
            if self.a_ms + self.b_ms + self.c_ms <= 0:
                raise ValueError("verify: a_ms + b_ms + c_ms must be > 0 (a forward takes time)")
            return
        for name in ("batch", "tokens_per_row"):
            axis = getattr(self, name)
            if not axis or axis[0] < 1 or any(b <= a for a, b in zip(axis, axis[1:])):
                raise ValueError(f"verify.{name} must be a strictly increasing list of integers >= 1, got {list(axis)}")
        if len(self.ms) != len(self.batch) or any(len(row) != len(self.tokens_per_row) for row in self.ms):
            raise ValueError(
                f"verify.ms must be {len(self.batch)} rows (one per batch size) of "
                f"{len(self.tokens_per_row)} values (one per tokens_per_row)"
            )
        if any(v <= 0 or not math.isfinite(v) for row in self.ms for v in row):
            raise ValueError("verify.ms values must be finite and > 0")

    @property
    def is_table(self) -> bool:
        return bool(self.batch)

    def __call__(self, batch: int, tokens_per_row: int) -> float:
        if not self.is_table:
            return self.a_ms + self.b_ms * batch + self.c_ms * batch * tokens_per_row
        key = (batch, tokens_per_row)
        if key not in self._looked_up:  # (a simulation asks for the same few shapes at every forward)
            per_batch = [_interpolate(tokens_per_row, self.tokens_per_row, row) for row in self.ms]
            # NOTE: extrapolation can go negative on a strange table; a forward never takes < 1 us.
            self._looked_up[key] = max(_interpolate(batch, self.batch, per_batch), 1e-3)
        return self._looked_up[key]

    def to_dict(self) -> dict[str, Any]:
        if self.is_table:
            return {"batch": list(self.batch), "tokens_per_row": list(self.tokens_per_row), "ms": [list(r) for r in self.ms]}
        return {"a_ms": self.a_ms, "b_ms": self.b_ms, "c_ms": self.c_ms}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "VerifyModel":
        known = {"a_ms", "b_ms", "c_ms", "batch", "tokens_per_row", "ms"}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown verify setting(s) {unknown}; known: {sorted(known)}")
        return cls(**values)


_LEGACY_OVERHEADS = (
    ("round_overhead_ms", "ingress_ms_per_round_message"),
    ("stream_overhead_ms", "ingress_ms_per_stream_message"),
)


def _interpolate(x: float, xs: tuple[int, ...], ys: list[float] | tuple[float, ...]) -> float:
    """Piecewise linear through (xs, ys), extended linearly past both ends."""
    if len(xs) == 1:
        return ys[0]
    i = min(max(bisect.bisect_right(xs, x) - 1, 0), len(xs) - 2)
    x0, x1, y0, y1 = xs[i], xs[i + 1], ys[i], ys[i + 1]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class Calibration:
    """Costs and acceptance of one draft/target pair on one serving setup (see module docstring)."""

    source: str = "PLACEHOLDER: illustrative numbers, not measured; load a calibration file for real figures"
    draft_ms_per_token: float = 1.3
    draft_cv: float = 0.1
    acceptance: tuple[float, ...] = (0.80, 0.74, 0.70, 0.66, 0.63, 0.60, 0.58, 0.56)
    verify: VerifyModel = field(default_factory=VerifyModel)
    ingress_ms_per_round_message: float = 1.45
    ingress_ms_per_stream_message: float = 1.0
    round_overhead_ms: float = 0.0
    stream_overhead_ms: float = 0.0
    round_overhead_by_link_ms: dict[str, float] = field(default_factory=dict)
    prefill_ms: float = 10.0
    open_overhead_ms: float = 0.0
    up_bytes_base: int = 40
    up_bytes_per_draft: int = 3
    down_bytes_per_round: int = 40
    open_bytes: int = 400
    down_bytes_per_token: int = 30

    def __post_init__(self) -> None:
        object.__setattr__(self, "acceptance", tuple(float(a) for a in self.acceptance))
        if isinstance(self.verify, dict):
            object.__setattr__(self, "verify", VerifyModel.from_dict(self.verify))
        if not self.acceptance:
            raise ValueError("acceptance: give at least one per-position probability")
        for i, a in enumerate(self.acceptance):
            if not 0.0 <= a <= 1.0:
                raise ValueError(f"acceptance[{i}] must be a probability in [0, 1], got {a}")
        if self.draft_ms_per_token <= 0:
            raise ValueError(f"draft_ms_per_token must be > 0, got {self.draft_ms_per_token}")
        for name in (
            "draft_cv",
            "ingress_ms_per_round_message",
            "ingress_ms_per_stream_message",
            "round_overhead_ms",
            "stream_overhead_ms",
            "prefill_ms",
            "open_overhead_ms",
        ):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        object.__setattr__(self, "round_overhead_by_link_ms", {str(k): float(v) for k, v in self.round_overhead_by_link_ms.items()})
        for link, value in self.round_overhead_by_link_ms.items():
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"round_overhead_by_link_ms[{link!r}] must be a finite number >= 0, got {value}")
        for name in ("up_bytes_base", "up_bytes_per_draft", "down_bytes_per_round", "open_bytes", "down_bytes_per_token"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    @classmethod
    def default(cls) -> "Calibration":
        """Placeholder numbers (see ``source``): shapes are right, magnitudes are guesses."""
        return cls()

    def acceptance_at(self, position: int) -> float:
        """P(accept the draft at 0-based ``position`` | every earlier one was accepted)."""
        return self.acceptance[min(position, len(self.acceptance) - 1)]

    def expected_acceptance_length(self, k: int) -> float:
        """Expected tokens committed by a round of k drafts, the bonus/recovered token included."""
        total, survive = 1.0, 1.0
        for i in range(k):
            survive *= self.acceptance_at(i)
            total += survive
        return total

    def round_overhead_for(self, link: str) -> float:
        """Non-queueing ms of one speculative round on the link profile named ``link``."""
        return self.round_overhead_ms + self.round_overhead_by_link_ms.get(link, 0.0)

    def up_bytes(self, k: int) -> int:
        return self.up_bytes_base + self.up_bytes_per_draft * k

    # ---- JSON ---------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        values["acceptance"] = list(self.acceptance)
        values["verify"] = self.verify.to_dict()
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "Calibration":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown calibration setting(s) {unknown}; known: {sorted(known)}")
        values = dict(values)
        if "verify" in values:
            values["verify"] = VerifyModel.from_dict(values["verify"])
        for overhead, ingress in _LEGACY_OVERHEADS:
            # A file from before the ingress: its overhead was the whole per-message cost.
            if overhead in values and ingress not in values:
                values[ingress] = 0.0
        return cls(**values)

    @classmethod
    def load(cls, path: str | Path) -> "Calibration":
        try:
            values = json.loads(Path(path).read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(values, dict):
            raise ValueError(f"{path}: a calibration file holds one JSON object")
        try:
            return cls.from_dict(values)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: {exc}") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")
