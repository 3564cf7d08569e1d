"""Sweeps over one knob and their plots: speedup vs RTT, best k vs RTT, capacity vs fleet size.

Each sweep returns plain rows (list of dicts, JSON-ready) and has a ``plot_*`` twin that
draws them with matplotlib (Agg backend, PNG). RTT sweeps use one device on a link with the
given base RTT and no jitter, loss or bandwidth limit unless ``link`` says otherwise, and the
same seed at every point (common random numbers), so curves are smooth and comparable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping, Sequence

from edgespec.cloud.link.profiles import LinkProfile
from edgespec.cloud.simulate.calibration import Calibration
from edgespec.cloud.simulate.config import FleetConfig, LinkMix
from edgespec.cloud.simulate.engine import CLOUD_ONLY, SPECULATIVE, simulate_path

DEFAULT_RTTS_MS = (0, 5, 10, 20, 40, 60, 80, 120, 160, 240, 320, 480, 640)
DEFAULT_DEVICE_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def _rtt_link(link: LinkProfile | None, rtt_ms: float) -> LinkProfile:
    base = link or LinkProfile("rtt-sweep")
    return base.replace(name=f"rtt {rtt_ms:g} ms", rtt_ms=float(rtt_ms))


def speedup_vs_rtt(
    rtts_ms: Iterable[float] = DEFAULT_RTTS_MS,
    calibration: Calibration | None = None,
    *,
    k: int | str = 4,
    devices: int = 1,
    replicas: int = 1,
    tokens_per_device: int = 512,
    link: LinkProfile | None = None,
    draft_ahead: bool = False,
    seed: int = 0,
) -> list[dict]:
    """Mean ms/token of both paths and their ratio at each base RTT."""
    calibration = calibration or Calibration.default()
    rows = []
    for rtt in rtts_ms:
        config = FleetConfig(
            devices=devices, link_mix=_rtt_link(link, rtt), replicas=replicas, k=k,
            tokens_per_device=tokens_per_device, draft_ahead=draft_ahead, seed=seed,
        )
        spec = simulate_path(config, calibration, SPECULATIVE).mean_ms_per_token
        cloud = simulate_path(config, calibration, CLOUD_ONLY).mean_ms_per_token
        rows.append({"rtt_ms": rtt, "speculative_ms_per_token": spec, "cloud_only_ms_per_token": cloud, "speedup": cloud / spec})
    return rows


def optimal_k_vs_rtt(
    rtts_ms: Iterable[float] = DEFAULT_RTTS_MS,
    ks: Sequence[int] = tuple(range(1, 17)),
    calibration: Calibration | None = None,
    *,
    devices: int = 1,
    replicas: int = 1,
    tokens_per_device: int = 1024,
    link: LinkProfile | None = None,
    draft_ahead: bool = False,
    seed: int = 0,
) -> list[dict]:
    """For each RTT, every fixed k in ``ks`` is simulated and the fastest kept; "auto" alongside."""
    calibration = calibration or Calibration.default()
    k_max = max(ks)
    rows = []
    for rtt in rtts_ms:
        def run(k):
            config = FleetConfig(
                devices=devices, link_mix=_rtt_link(link, rtt), replicas=replicas, k=k, k_max=k_max,
                tokens_per_device=tokens_per_device, draft_ahead=draft_ahead, seed=seed,
            )
            return simulate_path(config, calibration, SPECULATIVE)

        by_k = {k: run(k).mean_ms_per_token for k in ks}
        best_k = min(by_k, key=lambda k: (by_k[k], k))
        auto = run("auto")
        rows.append({
            "rtt_ms": rtt,
            "best_k": best_k,
            "best_ms_per_token": by_k[best_k],
            "ms_per_token_by_k": by_k,
            "auto_ms_per_token": auto.mean_ms_per_token,
            "auto_mean_k": auto.mean_k,
        })
    return rows


def capacity_vs_devices(
    device_counts: Iterable[int] = DEFAULT_DEVICE_COUNTS,
    calibration: Calibration | None = None,
    *,
    link_mix: LinkMix | str | Mapping[str, float] | LinkProfile = "wifi",  # as FleetConfig.link_mix
    replicas: int = 1,
    k: int | str = 4,
    max_batch_size: int = 32,
    batch_wait_ms: float = 5.0,
    duration_s: float = 20.0,
    draft_ahead: bool = False,
    seed: int = 0,
) -> list[dict]:
    """Tokens per second served, ms/token and utilisation of both paths as the fleet grows."""
    calibration = calibration or Calibration.default()
    rows = []
    for n in device_counts:
        config = FleetConfig(
            devices=n, link_mix=link_mix, replicas=replicas, k=k, max_batch_size=max_batch_size,
            batch_wait_ms=batch_wait_ms, duration_s=duration_s, draft_ahead=draft_ahead, seed=seed,
        )
        spec = simulate_path(config, calibration, SPECULATIVE)
        cloud = simulate_path(config, calibration, CLOUD_ONLY)
        rows.append({
            "devices": n,
            "speculative_tokens_per_s": spec.capacity_tokens_per_s,
            "cloud_only_tokens_per_s": cloud.capacity_tokens_per_s,
            "speculative_ms_per_token": spec.mean_ms_per_token,
            "cloud_only_ms_per_token": cloud.mean_ms_per_token,
            "speculative_utilisation": spec.mean_utilisation,
            "cloud_only_utilisation": cloud.mean_utilisation,
            "speculative_mean_batch": spec.mean_batch_size,
            "cloud_only_mean_batch": cloud.mean_batch_size,
        })
    return rows


# ---- plots --------------------------------------------------------------------------------


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers or in tests
    import matplotlib.pyplot as plt

    return plt


def plot_speedup_vs_rtt(rows: list[dict], path: str | Path, *, title: str = "") -> Path:
    plt = _pyplot()
    rtts = [r["rtt_ms"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(rtts, [r["speculative_ms_per_token"] for r in rows], "o-", label="speculative (edge draft)")
    left.plot(rtts, [r["cloud_only_ms_per_token"] for r in rows], "s-", label="cloud-only")
    left.set(xlabel="round-trip time (ms)", ylabel="ms per token (mean over devices)", title="latency per token")
    left.legend()
    right.plot(rtts, [r["speedup"] for r in rows], "o-", color="tab:green")
    right.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    right.set(xlabel="round-trip time (ms)", ylabel="speedup (cloud-only / speculative)", title="speedup")
    return _save(fig, plt, path, title)


def plot_optimal_k(rows: list[dict], path: str | Path, *, title: str = "") -> Path:
    plt = _pyplot()
    rtts = [r["rtt_ms"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.step(rtts, [r["best_k"] for r in rows], "o-", where="mid", label="best fixed k")
    left.plot(rtts, [r["auto_mean_k"] for r in rows], "x--", label="adaptive k (mean)")
    left.set(xlabel="round-trip time (ms)", ylabel="k (drafts per round)", title="optimal k")
    left.legend()
    right.plot(rtts, [r["best_ms_per_token"] for r in rows], "o-", label="best fixed k")
    right.plot(rtts, [r["auto_ms_per_token"] for r in rows], "x--", label="adaptive k")
    right.set(xlabel="round-trip time (ms)", ylabel="ms per token", title="at the best k")
    right.legend()
    return _save(fig, plt, path, title)


def plot_capacity(rows: list[dict], path: str | Path, *, title: str = "") -> Path:
    plt = _pyplot()
    n = [r["devices"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(n, [r["speculative_tokens_per_s"] for r in rows], "o-", label="speculative")
    left.plot(n, [r["cloud_only_tokens_per_s"] for r in rows], "s-", label="cloud-only")
    left.set(xscale="log", xlabel="devices", ylabel="tokens/s delivered", title="capacity")
    left.legend()
    right.plot(n, [r["speculative_ms_per_token"] for r in rows], "o-", label="speculative")
    right.plot(n, [r["cloud_only_ms_per_token"] for r in rows], "s-", label="cloud-only")
    right.set(xscale="log", xlabel="devices", ylabel="ms per token (mean)", title="per-device latency")
    right.legend()
    return _save(fig, plt, path, title)


def _save(fig, plt, path: str | Path, title: str) -> Path:
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
