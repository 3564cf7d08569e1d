"""The benchmark commands run end to end (tiny settings) and write their reports."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap

import pytest
from helpers import PROMPTS

from edgespec.cli import bench as bench_cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS[:6]))
    return path


def bench_args(server, prompt_file, out, what, *extra):
    """``edgespec bench WHAT`` against the test server, small; ``extra``: the mode's own flags."""
    parser = argparse.ArgumentParser()
    bench_cli.add_arguments(parser)
    return parser.parse_args(
        [what, "--target", str(server.pair.target_dir), "--draft", str(server.pair.draft_dir),
         "--prompts", str(prompt_file), "--out", str(out), "--server", server.address, "--prompt-limit", "2",
         "--max-new-tokens", "12", *extra]
    )


def test_bench_report(server, prompt_file, tmp_path):
    out = tmp_path / "report"
    assert bench_cli.run(bench_args(server, prompt_file, out, "report", "--held-out", str(prompt_file), "--k-values", "1,3",
                                         "--draft-hf", str(server.pair.draft_hf_dir))) == 0
    for name in ("report.json", "report.md", "speedup_vs_k.png", "acceptance.png", "sweeps.png"):
        assert (out / name).stat().st_size > 0, name
    report = json.loads((out / "report.json").read_text())
    assert report["baseline"]["identical"] == 2  # greedy speculative == cloud-only, both prompts
    assert {row["k"] for row in report["sweeps"]["k"]["rows"]} == {1, 3, "auto"}
    assert [row["label"] for row in report["sweeps"]["mode"]] == ["greedy", "exact", "token"]
    assert 0.0 < report["theory"]["alpha"] < 1.0
    assert report["costs"]["draft_rss_bytes"] > 0 and report["costs"]["replica_rss_bytes"] > 0
    assert report["limit"]["measured_speedup"] > 0
    peers = report["peers"]
    assert set(peers["arms"]) == {"target_only", "prompt_lookup", "assisted"}
    assert all(arm["identical_to_target_only"] == 2 and arm["ms_per_token"] > 0 for arm in peers["arms"].values())
    assert peers["edgespec_over_prompt_lookup"] > 0
    text = (out / "report.md").read_text()
    assert "Closeness to the limit" in text and "prompt-lookup decoding" in text


def test_bench_capacity(server, prompt_file, tmp_path):
    out = tmp_path / "capacity"
    assert bench_cli.run(bench_args(server, prompt_file, out, "capacity", "--sessions", "1,3")) == 0
    rows = json.loads((out / "capacity.json").read_text())
    assert [row["sessions"] for row in rows] == [1, 3]
    assert all(row["speculative_tokens_per_s"] > 0 and row["cloud_only_tokens_per_s"] > 0 for row in rows)
    assert (out / "capacity.png").stat().st_size > 0


def test_bench_links(server, prompt_file, tmp_path):
    out = tmp_path / "links"
    args = bench_args(server, prompt_file, out, "links", "--sessions", "2", "--link", "loopback,wifi", "--other-ingresses", "")
    assert bench_cli.run(args) == 0
    data = json.loads((out / "links.json").read_text())
    assert [row["profile"] for row in data["profiles"]] == ["loopback", "wifi"]
    for row in data["profiles"]:
        assert set(row["sim"]["errors"]) == {"spec_1", "cloud_1", "spec_n", "cloud_n"}
        assert row["speedup_auto"] > 0 and row["capacity_ratio"] > 0 and row["capacity"]["exact"]
        assert sum(row["tokens_by_path"].values()) == 2 * 12  # every generated token came by one path
        assert set(row["variants"]) == {"k4_one_in_flight", "adaptive_one_in_flight", "adaptive_send_ahead", "adaptive_tree"}
        parts = row["breakdown"]
        assert parts["sum_ms"] == sum(parts[k] for k in ("link_ms", "ingress_ms", "verify_ms", "draft_ms", "client_ms", "emulator_late_ms"))
    wifi = data["profiles"][1]["breakdown"]
    assert wifi["link_ms"] > 10  # the emulator's own delays show up as the link's share of a round
    assert json.loads((out / "calibration.json").read_text())["draft_ms_per_token"] > 0
    text = (out / "links.md").read_text()
    assert "Simulator vs emulator" in text and "Where a round's time goes" in text


def test_bench_planner(server, prompt_file, tmp_path):
    """k=auto against cloud-only and the always-speculating arms, on the same prompts, with the
    switch log of each k=auto request."""
    out = tmp_path / "planner"
    assert bench_cli.run(bench_args(server, prompt_file, out, "planner", "--link", "loopback", "--max-new-tokens", "16")) == 0
    data = json.loads((out / "planner.json").read_text())
    (row,) = data["profiles"]
    assert row["profile"] == "loopback" and set(row["always_ms"]) == {"always, adaptive k", "always, adaptive k + send-ahead"}
    assert row["cloud_only_ms"] > 0 and row["auto_ms"] > 0 and row["auto_over_best"] > 0
    assert len(row["switch_logs"]) == 2 and all(log and log[0]["from_path"] is None for log in row["switch_logs"])
    assert "k=auto / faster" in (out / "planner.md").read_text()


# Raw bidi sessions run again and again (a benchmark's calibration) while a client stays open:
# on an asyncio.run loop per step each closed loop got late gRPC completions, printed as
# "Exception in callback PollerCompletionQueue._handle_events ... Event loop is closed" (14
# times in this script); on the SDK's shared loop (edgespec.edge.loop) none.
NO_CLOSED_LOOP_SCRIPT = textwrap.dedent("""
    import sys
    from edgespec.cloud.bench.ingress import raw_rounds
    from edgespec.edge.client import EdgeClient

    address, draft = sys.argv[1:3]
    with EdgeClient(address, draft) as kept:
        fingerprint = kept.info().tokenizer_fingerprint
        kept.generate("hello", max_new_tokens=4)
        for _ in range(6):
            raw_rounds(address, fingerprint, vocab=100, k=8, rounds=20, sessions=16)
    print("done")
""")


def test_benchmark_steps_print_no_closed_loop_errors(server):
    done = subprocess.run([sys.executable, "-c", NO_CLOSED_LOOP_SCRIPT, server.address, str(server.pair.draft_dir)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "done" in done.stdout, done.stderr[-3000:]
    assert "Event loop is closed" not in done.stderr, done.stderr[-3000:]
