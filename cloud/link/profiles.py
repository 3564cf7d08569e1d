"""What a network link does to bytes: named profiles and the one-direction delay model.

Shared by the link emulator (``edgespec link``, real bytes over loopback) and the fleet
simulator (``edgespec simulate``, simulated messages), so both mean the same thing by
"a 4g link". Sources for every profile number are in ``docs/links.md``.

Terms, per direction of a connection (up = device -> cloud, down = cloud -> device):

- **chunk**: a run of bytes handed over at one instant (one ``recv`` in the emulator, one
  message in the simulator). The model never looks inside a chunk.
- **base delay**: ``rtt_ms / 2``, propagation plus the minimum processing on the path.
- **jitter**: a random extra delay per chunk, >= 0, with mean ``jitter_ms / 2`` per direction,
  so the mean round trip is ``rtt_ms + jitter_ms``. The default shape is exponential (queueing
  delay has a long tail); ``uniform`` (0..jitter_ms) and ``halfnormal`` are offered too.
- **serialisation**: a chunk of b bytes occupies the link for ``b * 8 / bandwidth`` seconds;
  chunks queue behind each other (bandwidth 0 means unlimited).
- **loss**: TCP never loses bytes end to end, so a lost segment shows up as a stall: each
  MSS-sized segment of a chunk is lost with probability ``loss_pct / 100`` and a chunk with a
  lost segment is held one retransmission timeout longer, RTO = rtt + max(200 ms, 4 * jitter)
  (RFC 6298: RTO = SRTT + max(G, 4 * RTTVAR); Linux floors the variance term at
  TCP_RTO_MIN = 200 ms). One RTO per chunk; exponential backoff on a second loss is ignored.
- **release time** of a chunk: when it leaves the far end of the link. Order is preserved:
  ``release = max(previous release, transmit end + base delay + jitter + loss stall)``.

``Faults`` schedules what a link does besides delaying: resets and stalls (``emulator.py``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Callable

JITTER_SHAPES = ("exponential", "uniform", "halfnormal")
MSS_BYTES = 1448  # TCP payload per segment on a 1500-byte MTU path with timestamps
RTO_MIN_MS = 200.0  # Linux TCP_RTO_MIN (include/net/tcp.h: HZ/5)
_STANDARD_NORMAL = NormalDist()


@dataclass(frozen=True)
class LinkProfile:
    """One access link, both directions.

    Attributes:
        name: a label for printouts ("custom" when built from flags).
        rtt_ms: base round-trip time, the floor: propagation and minimum processing.
        jitter_ms: mean extra round-trip delay from queueing (see module docstring);
            the median emulated RTT of the exponential shape is about rtt_ms + 0.84 * jitter_ms.
        bandwidth_up_mbit: device -> cloud rate in Mbit/s; 0 means unlimited.
        bandwidth_down_mbit: cloud -> device rate in Mbit/s; 0 means unlimited.
        loss_pct: per-segment loss probability in percent, seen as retransmission stalls.
        jitter_shape: "exponential", "uniform" or "halfnormal".
    """

    name: str = "custom"
    rtt_ms: float = 0.0
    jitter_ms: float = 0.0
    bandwidth_up_mbit: float = 0.0
    bandwidth_down_mbit: float = 0.0
    loss_pct: float = 0.0
    jitter_shape: str = "exponential"

    def __post_init__(self) -> None:
        for name in ("rtt_ms", "jitter_ms", "bandwidth_up_mbit", "bandwidth_down_mbit", "loss_pct"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if self.loss_pct >= 100:
            raise ValueError(f"loss_pct must be below 100 (TCP would never deliver), got {self.loss_pct}")
        if self.jitter_shape not in JITTER_SHAPES:
            raise ValueError(f"jitter_shape must be one of {JITTER_SHAPES}, got {self.jitter_shape!r}")

    @property
    def is_transparent(self) -> bool:
        """True when the link adds nothing: the emulator forwards without scheduling."""
        return self.rtt_ms == 0 and self.jitter_ms == 0 and self.loss_pct == 0 and (
            self.bandwidth_up_mbit == 0 and self.bandwidth_down_mbit == 0
        )

    @property
    def rto_ms(self) -> float:
        """Retransmission timeout charged for a lost segment (RFC 6298 with Linux's floor)."""
        return self.rtt_ms + max(RTO_MIN_MS, 4.0 * self.jitter_ms)

    def bandwidth_mbit(self, direction: str) -> float:
        if direction == "up":
            return self.bandwidth_up_mbit
        if direction == "down":
            return self.bandwidth_down_mbit
        raise ValueError(f"direction must be 'up' or 'down', got {direction!r}")

    def jitter_extra_ms(self, u: float) -> float:
        """One direction's extra delay for a uniform draw u in [0, 1); mean jitter_ms / 2."""
        mean = self.jitter_ms / 2.0
        if mean == 0:
            return 0.0
        if self.jitter_shape == "exponential":
            return -mean * math.log1p(-u)
        if self.jitter_shape == "uniform":
            return 2.0 * mean * u
        # Half-normal |N(0, s)| has mean s * sqrt(2 / pi); inverse CDF via the normal's.
        scale = mean * math.sqrt(math.pi / 2.0)
        return scale * _STANDARD_NORMAL.inv_cdf(min(0.5 + u / 2.0, 1.0 - 1e-12))

    def loss_probability(self, nbytes: int) -> float:
        """Probability that a chunk of nbytes loses at least one of its segments."""
        if self.loss_pct == 0:
            return 0.0
        segments = max(1, math.ceil(nbytes / MSS_BYTES))
        return 1.0 - (1.0 - self.loss_pct / 100.0) ** segments

    def replace(self, **changes) -> "LinkProfile":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        def rate(mbit: float) -> str:
            return "unlimited" if mbit == 0 else f"{mbit:g} Mbit/s"

        return (
            f"{self.name}: rtt {self.rtt_ms:g} ms + jitter {self.jitter_ms:g} ms ({self.jitter_shape}), "
            f"up {rate(self.bandwidth_up_mbit)}, down {rate(self.bandwidth_down_mbit)}, "
            f"loss {self.loss_pct:g}% (stall {self.rto_ms:g} ms per lost segment)"
        )


class DirectionSchedule:
    """Release times of the chunks crossing one direction of one link, in milliseconds.

    ``uniform`` supplies draws in [0, 1) (``random.Random().random`` or a numpy Generator's
    ``random``), so the emulator and the simulator share the arithmetic but not an RNG type.
    """

    def __init__(self, profile: LinkProfile, direction: str, uniform: Callable[[], float]):
        self.direction = direction
        self.uniform = uniform
        self.link_free_ms = -math.inf  # when the transmitter finishes its current chunk
        self.last_release_ms = -math.inf
        self.use_profile(profile)

    def use_profile(self, profile: LinkProfile) -> None:
        """Later chunks follow ``profile`` (order is still preserved against earlier ones)."""
        self.profile = profile
        self.bandwidth_mbit = profile.bandwidth_mbit(self.direction)

    def release_ms(self, arrival_ms: float, nbytes: int) -> float:
        profile = self.profile
        start = max(arrival_ms, self.link_free_ms)
        # Mbit/s is bits per microsecond: bytes * 8 / (mbit * 1000) is milliseconds.
        transmit = nbytes * 8.0 / (self.bandwidth_mbit * 1000.0) if self.bandwidth_mbit > 0 else 0.0
        self.link_free_ms = start + transmit
        delay = profile.rtt_ms / 2.0
        if profile.jitter_ms > 0:
            delay += profile.jitter_extra_ms(self.uniform())
        if profile.loss_pct > 0 and self.uniform() < profile.loss_probability(nbytes):
            delay += profile.rto_ms
        release = max(self.last_release_ms, self.link_free_ms + delay)
        self.last_release_ms = release
        return release


@dataclass(frozen=True)
class Faults:
    """Scheduled faults; None disables each.

    Attributes:
        reset_after_s: reset (RST) each connection this many seconds after it opened.
        stall_every_s: start a stall every this many seconds after the emulator starts.
        stall_for_s: how long each scheduled stall pauses forwarding.
    """

    reset_after_s: float | None = None
    stall_every_s: float | None = None
    stall_for_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("reset_after_s", "stall_every_s", "stall_for_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 seconds (or None to disable), got {value}")
        if (self.stall_every_s is None) != (self.stall_for_s is None):
            raise ValueError("stall_every_s and stall_for_s go together: set both or neither")
        if self.stall_every_s is not None and self.stall_for_s >= self.stall_every_s:
            raise ValueError(f"stall_for_s ({self.stall_for_s}) must be shorter than stall_every_s ({self.stall_every_s})")



# Each profile's numbers and their sources: docs/links.md. Base RTTs are set so that the
# median emulated RTT (base + ~0.84 * jitter for the exponential shape) matches the cited
# median; loss figures are assumptions (cellular link layers retransmit most radio losses).
PROFILES: dict[str, LinkProfile] = {
    p.name: p
    for p in (
        LinkProfile("loopback"),
        LinkProfile("lan", rtt_ms=0.8, jitter_ms=0.2, bandwidth_up_mbit=1000, bandwidth_down_mbit=1000),
        LinkProfile("wifi", rtt_ms=10, jitter_ms=6, bandwidth_up_mbit=40, bandwidth_down_mbit=85, loss_pct=0.1),
        LinkProfile("5g", rtt_ms=26, jitter_ms=8, bandwidth_up_mbit=20, bandwidth_down_mbit=165, loss_pct=0.1),
        LinkProfile("4g", rtt_ms=48, jitter_ms=15, bandwidth_up_mbit=6, bandwidth_down_mbit=20, loss_pct=0.3),
        LinkProfile("starlink", rtt_ms=37, jitter_ms=10, bandwidth_up_mbit=13, bandwidth_down_mbit=95, loss_pct=0.5),
        LinkProfile("congested", rtt_ms=150, jitter_ms=60, bandwidth_up_mbit=1, bandwidth_down_mbit=4, loss_pct=2.0),
        LinkProfile("satellite", rtt_ms=600, jitter_ms=30, bandwidth_up_mbit=3, bandwidth_down_mbit=18, loss_pct=0.5),
    )
}


def get_profile(name: str) -> LinkProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown link profile {name!r}; known: {sorted(PROFILES)}") from None
