"""Server metrics in Prometheus format, through Ray Serve's metrics API.

Ray exports them on every node's metrics endpoint (``ray start --metrics-export-port``, or
``_metrics_export_port`` in ``ray.init``) with the Serve tags (application, deployment,
replica) added. Names, all prefixed ``edgespec_``:

- ``drafted_tokens_total``, ``accepted_tokens_total``, ``rounds_total`` (tag ``mode``);
- ``position_drafted_total`` / ``position_accepted_total`` (tag ``position``, 1-based):
  their ratio is the acceptance at each draft position;
- ``acceptance_length`` histogram: tokens committed per round, the bonus token included;
- ``verify_batch_size`` histogram and ``verify_seconds`` histogram: sessions per target forward
  and the forward's time (seconds, as Prometheus's conventions want a time);
- ``generated_tokens_total`` (tag ``path``: speculative or cloud_only);
- ``active_sessions`` gauge; ``sessions_total`` (tags ``path``, ``key``: the API key's id, never
  the key); ``errors_total`` (tags ``code``, ``key``; a client that goes away is no error);
- ``discarded_blocks_total``: sent-ahead blocks whose assumption failed (no forward ran);
- ``sessions_moved_total`` (tag ``path``): sessions told to move while the replica drained.

Ray exports each as ``ray_<name>`` (a histogram as ``_bucket``/``_sum``/``_count``);
``METRIC_NAMES`` lists them for the dashboard's test (cluster/grafana-dashboard.json).
"""

from __future__ import annotations

from collections import Counter as Tally

from ray.serve import metrics

from edgespec.cloud.serving.verifier import VerifyItem

LENGTH_BOUNDARIES = [float(n) + 0.5 for n in range(1, 17)]
BATCH_BOUNDARIES = [1.5, 2.5, 4.5, 8.5, 16.5, 32.5, 64.5, 128.5]
SECONDS_BOUNDARIES = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0]


# (name, kind) of every metric VerifierMetrics registers.
METRICS = (
    ("edgespec_drafted_tokens_total", "counter"), ("edgespec_accepted_tokens_total", "counter"),
    ("edgespec_rounds_total", "counter"), ("edgespec_position_drafted_total", "counter"),
    ("edgespec_position_accepted_total", "counter"), ("edgespec_acceptance_length", "histogram"),
    ("edgespec_verify_batch_size", "histogram"), ("edgespec_verify_seconds", "histogram"),
    ("edgespec_generated_tokens_total", "counter"), ("edgespec_active_sessions", "gauge"),
    ("edgespec_sessions_total", "counter"), ("edgespec_errors_total", "counter"),
    ("edgespec_discarded_blocks_total", "counter"), ("edgespec_sessions_moved_total", "counter"),
)


def exported_names() -> set[str]:
    """The series names Ray's endpoint shows for METRICS (``ray_`` prefix, histogram suffixes)."""
    names = set()
    for name, kind in METRICS:
        suffixes = ("_bucket", "_sum", "_count") if kind == "histogram" else ("",)
        names.update(f"ray_{name}{suffix}" for suffix in suffixes)
    return names


class VerifierMetrics:
    def __init__(self) -> None:
        self.drafted = metrics.Counter("edgespec_drafted_tokens_total", "Draft tokens received for verification", tag_keys=("mode",))
        self.accepted = metrics.Counter("edgespec_accepted_tokens_total", "Draft tokens accepted", tag_keys=("mode",))
        self.rounds = metrics.Counter("edgespec_rounds_total", "Verification rounds (one target call each)", tag_keys=("mode",))
        self.position_drafted = metrics.Counter("edgespec_position_drafted_total", "Drafts sent at each block position", tag_keys=("position",))
        self.position_accepted = metrics.Counter("edgespec_position_accepted_total", "Drafts accepted at each block position", tag_keys=("position",))
        self.acceptance_length = metrics.Histogram(
            "edgespec_acceptance_length", "Tokens committed per round (bonus included)", boundaries=LENGTH_BOUNDARIES
        )
        self.batch_size = metrics.Histogram("edgespec_verify_batch_size", "Sessions per target forward", boundaries=BATCH_BOUNDARIES)
        self.verify_seconds = metrics.Histogram("edgespec_verify_seconds", "Target forward + accept rule per batch (seconds)",
                                                boundaries=SECONDS_BOUNDARIES)
        self.generated = metrics.Counter("edgespec_generated_tokens_total", "Tokens committed", tag_keys=("path",))
        self.active_sessions = metrics.Gauge("edgespec_active_sessions", "Open sessions and Generate calls on the replica")
        self.sessions = metrics.Counter("edgespec_sessions_total", "Sessions opened", tag_keys=("path", "key"))  # pyright: ignore[reportArgumentType] (ray types it Tuple[str])
        self.errors = metrics.Counter("edgespec_errors_total", "Requests refused or failed", tag_keys=("code", "key"))  # pyright: ignore[reportArgumentType] (ray types it Tuple[str])
        self.discarded = metrics.Counter("edgespec_discarded_blocks_total", "Sent-ahead blocks discarded (assumption failed)")
        self.moved = metrics.Counter("edgespec_sessions_moved_total", "Sessions told to move while the replica drained", tag_keys=("path",))

    def record_batch(self, items: list[VerifyItem], verdicts) -> None:
        """One verification batch: counters summed first, so the cost is per batch, not per token."""
        self.batch_size.observe(len(items))
        self.verify_seconds.observe(verdicts[0].verify_ms / 1000.0)
        drafted, accepted, rounds = Tally(), Tally(), Tally()
        pos_drafted, pos_accepted = Tally(), Tally()
        emitted = {"speculative": 0, "cloud_only": 0}
        for item, verdict in zip(items, verdicts):
            if item.block is None:
                emitted["cloud_only"] += verdict.emitted
                continue
            mode = item.state.mode.value
            k = len(item.block.tokens)
            drafted[mode] += k
            accepted[mode] += verdict.accepted
            rounds[mode] += 1
            emitted["speculative"] += verdict.emitted
            self.acceptance_length.observe(verdict.emitted)
            if item.block.parents is not None:
                continue  # a tree's tokens have no single position each
            for position in range(1, k + 1):
                pos_drafted[position] += 1
                if position <= verdict.accepted:
                    pos_accepted[position] += 1
        for mode in drafted:
            self.drafted.inc(drafted[mode], tags={"mode": mode})
            if accepted[mode]:
                self.accepted.inc(accepted[mode], tags={"mode": mode})
            self.rounds.inc(rounds[mode], tags={"mode": mode})
        for position, count in pos_drafted.items():
            self.position_drafted.inc(count, tags={"position": str(position)})
            if pos_accepted[position]:
                self.position_accepted.inc(pos_accepted[position], tags={"position": str(position)})
        for path, count in emitted.items():
            if count:
                self.generated.inc(count, tags={"path": path})

    def session_opened(self, generate: bool, active: int, key_id: str = "") -> None:
        self.sessions.inc(tags={"path": "cloud_only" if generate else "speculative", "key": key_id})
        self.active_sessions.set(active)

    def session_closed(self, active: int) -> None:
        self.active_sessions.set(active)

    def discarded_block(self) -> None:
        self.discarded.inc()

    def session_moved(self, generate: bool) -> None:
        self.moved.inc(tags={"path": "cloud_only" if generate else "speculative"})

    def error(self, code, key_id: str = "") -> None:
        self.errors.inc(tags={"code": code.name, "key": key_id})

