"""The scenario to simulate: how many devices on which links, how many replicas, how to draft."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from edgespec.cloud.link.profiles import LinkProfile, get_profile
from edgespec.cloud.serving.config import BATCH_WAIT_FOR

LinkMix = tuple[tuple[LinkProfile, float], ...]


def parse_link_mix(text: str) -> LinkMix:
    """``"wifi:0.5,4g:0.3,5g:0.2"`` -> profiles with weights (normalised later); a bare name weighs 1."""
    mix = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, weight_text = part.partition(":")
        try:
            weight = float(weight_text) if sep else 1.0
        except ValueError:
            raise ValueError(f"link_mix: weight of {name!r} must be a number, got {weight_text!r}") from None
        mix.append((get_profile(name.strip()), weight))
    if not mix:
        raise ValueError(f"link_mix: expected NAME:WEIGHT[,NAME:WEIGHT...], got {text!r}")
    return tuple(mix)


def _normalise_mix(mix: str | Mapping[str, float] | Sequence[tuple[LinkProfile | str, float]] | LinkProfile) -> LinkMix:
    if isinstance(mix, str):
        mix = parse_link_mix(mix)
    elif isinstance(mix, LinkProfile):
        mix = ((mix, 1.0),)
    elif isinstance(mix, Mapping):
        mix = tuple(mix.items())
    pairs = []
    for profile, weight in mix:
        if isinstance(profile, str):
            profile = get_profile(profile)
        if not (isinstance(weight, (int, float)) and math.isfinite(weight) and weight > 0):
            raise ValueError(f"link_mix: weight of {profile.name!r} must be > 0, got {weight!r}")
        pairs.append((profile, float(weight)))
    if not pairs:
        raise ValueError("link_mix: give at least one link")
    total = sum(w for _, w in pairs)
    return tuple((p, w / total) for p, w in pairs)


@dataclass(frozen=True)
class FleetConfig:
    """One fleet scenario.

    Attributes:
        devices: number of edge devices, one session each.
        link_mix: which links the devices sit on: "wifi:0.5,4g:0.5", {name: weight}, a
            LinkProfile, or (LinkProfile, weight) pairs. Devices are split by largest
            remainder (so 10 devices at 0.5/0.3/0.2 are exactly 5/3/2), then shuffled by seed.
        replicas: verifier replicas; devices are assigned round-robin and stay (sticky stream).
        k: drafts per round, or "auto" for the edge SDK's adaptive policy (``edge/planner.py``).
        k_max: the server's max_k: the upper bound for "auto" and for a fixed k.
        tokens_per_device: each device generates this many tokens, then stops.
        duration_s: instead, every device generates until this much simulated time has passed.
        max_batch_size: most rows in one replica forward.
        batch_wait_ms: the replica's batch_wait_timeout_s, in ms (``cloud/serving/scheduler.py``):
            once the model is free, a batch waits at most this long for more of the open
            sessions and starts at once when none of those not yet in is expected back by then.
            0 takes only what queued during the previous forward. Default 5, as the server's.
        batch_wait_for: the replica's batch_wait_for: "returning" (the default, as the
            server's) waits only for the sessions expected back within the wait, "all" for
            every open session.
        draft_ahead: while a block is in flight the device drafts on, assuming full
            acceptance; that work counts only if the target's bonus token matches the
            draft's next guess (probability: the acceptance at the next position).
        start_spread_ms: devices open their sessions at uniform random times in [0, this).
        seed: every random draw derives from it (same seed, same result).
    """

    devices: int = 1
    link_mix: LinkMix | str | Mapping[str, float] | LinkProfile = "wifi"
    replicas: int = 1
    k: int | str = 4
    k_max: int = 16
    tokens_per_device: int | None = None
    duration_s: float | None = None
    max_batch_size: int = 32
    batch_wait_ms: float = 5.0
    batch_wait_for: str = "returning"
    draft_ahead: bool = False
    start_spread_ms: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "link_mix", _normalise_mix(self.link_mix))
        for name in ("devices", "replicas", "k_max", "max_batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if isinstance(self.k, str) and self.k.isdigit():
            object.__setattr__(self, "k", int(self.k))
        if self.k != "auto" and not (isinstance(self.k, int) and 1 <= self.k <= self.k_max):
            raise ValueError(f"k must be 'auto' or an integer in 1..k_max ({self.k_max}), got {self.k!r}")
        if self.tokens_per_device is None and self.duration_s is None:
            object.__setattr__(self, "tokens_per_device", 256)
        if self.tokens_per_device is not None and self.duration_s is not None:
            raise ValueError("tokens_per_device and duration_s exclude each other: set one")
        if self.tokens_per_device is not None and self.tokens_per_device < 1:
            raise ValueError(f"tokens_per_device must be >= 1, got {self.tokens_per_device}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ValueError(f"duration_s must be > 0, got {self.duration_s}")
        if not self.batch_wait_ms >= 0:
            raise ValueError(f"batch_wait_ms must be >= 0, got {self.batch_wait_ms}")
        if self.batch_wait_for not in BATCH_WAIT_FOR:
            raise ValueError(f"batch_wait_for must be one of {BATCH_WAIT_FOR}, got {self.batch_wait_for!r}")
        if not self.start_spread_ms >= 0:
            raise ValueError(f"start_spread_ms must be >= 0, got {self.start_spread_ms}")

    def device_links(self) -> list[LinkProfile]:
        """The link of each device, in device order (largest-remainder split, unshuffled)."""
        quotas = [w * self.devices for _, w in self.link_mix]
        counts = [int(q) for q in quotas]
        by_remainder = sorted(range(len(quotas)), key=lambda i: (-(quotas[i] - counts[i]), i))
        for i in by_remainder[: self.devices - sum(counts)]:
            counts[i] += 1
        return [profile for (profile, _), n in zip(self.link_mix, counts) for _ in range(n)]

    def describe(self) -> str:
        mix = ", ".join(f"{p.name} {w:.0%}" for p, w in self.link_mix)
        budget = f"{self.tokens_per_device} tokens/device" if self.tokens_per_device else f"{self.duration_s:g} s"
        ahead = ", draft-ahead" if self.draft_ahead else ""
        return (
            f"{self.devices} device(s) [{mix}], {self.replicas} replica(s) (max batch {self.max_batch_size}"
            f"{f', wait {self.batch_wait_ms:g} ms' if self.batch_wait_ms else ''}"
            f"{' for all' if self.batch_wait_ms and self.batch_wait_for == 'all' else ''}), "
            f"k={self.k}{ahead}, {budget}, seed {self.seed}"
        )
