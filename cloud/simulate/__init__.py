"""Fleet simulator: many edge devices on mixed links, a few verifier replicas, in simulated time.

A discrete-event simulation (``engine.py``) of the speculative path (draft on the device, one
round trip per block, batched verification on the replica) and of the cloud-only baseline
(Generate: the replica decodes every token, tokens stream down the link). Links use the same
delay model and profiles as the link emulator (``edgespec.cloud.link.profiles``); costs and
acceptance come from a ``Calibration`` (JSON, schema in ``calibration.py``).

    from edgespec.cloud.simulate import FleetConfig, simulate
    result = simulate(FleetConfig(devices=100, link_mix="wifi:0.7,4g:0.3", replicas=2, k="auto"))
    print(result.table())

Command line: ``edgespec simulate --help``.

One device's planner (``speculate="auto"``) in a scripted world, with no wall clock: ``planner.py``
(not exported here; the planner's tests and lab/'s planner experiments use it).
"""

from edgespec.cloud.simulate.calibration import Calibration, VerifyModel
from edgespec.cloud.simulate.config import FleetConfig, parse_link_mix
from edgespec.cloud.simulate.engine import CLOUD_ONLY, SPECULATIVE, FleetSimulation, simulate, simulate_path
from edgespec.cloud.simulate.result import PathResult, SimResult
from edgespec.cloud.simulate.sweeps import (
    capacity_vs_devices,
    optimal_k_vs_rtt,
    plot_capacity,
    plot_optimal_k,
    plot_speedup_vs_rtt,
    speedup_vs_rtt,
)

__all__ = [
    "CLOUD_ONLY",
    "SPECULATIVE",
    "Calibration",
    "FleetConfig",
    "FleetSimulation",
    "PathResult",
    "SimResult",
    "VerifyModel",
    "capacity_vs_devices",
    "optimal_k_vs_rtt",
    "parse_link_mix",
    "plot_capacity",
    "plot_optimal_k",
    "plot_speedup_vs_rtt",
    "simulate",
    "simulate_path",
    "speedup_vs_rtt",
]
