"""The real driver (``edge/rounds.py``) with a planner told scripted figures instead of what the
device measures (``ScriptedPlanner``), so its decisions depend on tokens, not on the machine.
The scripted world the planner is simulated in is the product's
``edgespec.cloud.simulate.planner``."""

from __future__ import annotations

from dataclasses import dataclass, field

from edgespec.cloud.simulate.planner import rtt_phases
from edgespec.edge.planner import Path, Planner


@dataclass
class Script:
    """What a ``ScriptedPlanner`` is told instead of what the device measured: the round trip
    by phase (tokens of the current request), the replica's and the device's times."""

    phases: list[tuple[int, float]] = field(default_factory=lambda: [(0, 2.0)])
    forward_ms: float = 5.0
    decode_ms: float = 10.0  # the stream's rate, per token
    prefill_ms: float = 20.0
    device_ms: float = 1.0
    position: int = 0  # tokens of the current request the planner has been told of
    planners: list = field(default_factory=list)  # the planners made while this script was in force

    @property
    def rtt_ms(self) -> float:
        return rtt_phases(*self.phases)(self.position)


class ScriptedPlanner(Planner):
    """The planner the real driver (``edge/rounds.py``) calls, in its own order, with every time
    it measures replaced by the script's: its decisions depend on tokens, not on the machine."""

    script: Script = Script()

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.script.planners.append(self)

    def first_path(self, max_new_tokens: int, max_k: int = 16) -> Path:
        self.script.position = 0
        return super().first_path(max_new_tokens, max_k)

    def record_rtt(self, ms: float) -> None:
        super().record_rtt(self.script.rtt_ms)

    def record_forward(self, ms: float) -> None:
        super().record_forward(self.script.forward_ms)

    def record_decode(self, ms: float, *, stream_ms: float = 0.0) -> None:
        super().record_decode(self.script.decode_ms)

    def record_round(self, *, wall_ms, wait_ms, forward_ms, tokens, k=None) -> None:
        s = self.script
        forward = s.forward_ms + (s.prefill_ms if self._segment_rounds == 0 else 0.0)
        wait = None if wait_ms is None else s.rtt_ms + forward
        wall = (wait if wait is not None else forward) + s.device_ms
        super().record_round(wall_ms=wall, wait_ms=wait, forward_ms=forward, tokens=tokens, k=k)
        s.position += tokens

    def record_cloud_rate(self, ms_since_first: float, tokens_since_first: int, **_) -> None:
        self.script.position += tokens_since_first - self._segment_tokens
        super().record_cloud_rate(self.script.decode_ms * tokens_since_first, tokens_since_first)

    def record_shadow(self, hits, k=None, *, draft_ms=None) -> None:
        super().record_shadow(hits, k)  # the draft's real time would make the shadow's share the machine's
