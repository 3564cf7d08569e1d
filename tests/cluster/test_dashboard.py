"""cluster/grafana-dashboard.json names only metrics that exist: edgespec's as metrics.py
registers them (with Ray's ``ray_`` prefix and histogram suffixes), Serve's as Ray defines them."""

from __future__ import annotations

import json
import re
from pathlib import Path

from helpers import REPO

from edgespec.cloud.serving.metrics import exported_names

DASHBOARD = REPO / "cluster" / "grafana-dashboard.json"
# A PromQL metric name: an identifier not followed by "(" (a function) and not a label or keyword.
IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
PROMQL_WORDS = {"sum", "by", "rate", "max", "min", "avg", "histogram_quantile", "le", "without", "on", "ignoring"}


def expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def metric_names(expr: str) -> set[str]:
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^]]*\]", "", expr)  # range windows
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", expr)  # grouping labels
    return {name for name in IDENTIFIER.findall(expr) if name not in PROMQL_WORDS and not name.isdigit()
            and not re.fullmatch(r"\d*e\d*", name)}


def test_the_name_parser_finds_metrics_not_functions_or_labels():
    assert metric_names('sum by (position) (rate(ray_a_total{x="y"}[5m])) / 1000 * max(ray_b)') == {"ray_a_total", "ray_b"}


def test_every_edgespec_metric_the_dashboard_names_is_one_the_replica_exports():
    named = set().union(*(metric_names(e) for e in expressions()))
    ours = {n for n in named if n.startswith("ray_edgespec_")}
    assert ours <= exported_names(), sorted(ours - exported_names())
    # the panels the operator needs: acceptance by position, time per token, sessions, refusals
    for needed in ("ray_edgespec_position_accepted_total", "ray_edgespec_verify_seconds_sum",
                   "ray_edgespec_active_sessions", "ray_edgespec_errors_total"):
        assert needed in ours
    assert named - ours, "Serve's own metrics (queue, replicas) are on the dashboard too"


def test_every_serve_metric_the_dashboard_names_is_defined_by_ray():
    import ray.serve

    serve_dir = Path(ray.serve.__file__).parent
    defined = set()
    for source in serve_dir.rglob("*.py"):
        defined.update(re.findall(r"[\"'](serve_[a-z_]+)[\"']", source.read_text(errors="replace")))
    named = set().union(*(metric_names(e) for e in expressions()))
    theirs = {n for n in named if not n.startswith("ray_edgespec_")}
    assert theirs and all(n.startswith("ray_serve_") for n in theirs), sorted(theirs)
    assert {n.removeprefix("ray_") for n in theirs} <= defined, sorted(n for n in theirs if n.removeprefix("ray_") not in defined)
