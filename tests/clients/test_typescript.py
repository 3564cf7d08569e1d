"""The TypeScript client (clients/typescript, @edgespec/client) in `make test`: its own unit tests
and type check, the conformance kit's 21 scenarios over gRPC and over WebSocket, its planner
against edge/planner.py on one script of events, and greedy output through a real Serve verifier
(the demo pair) equal to the Python SDK's on held-out prompts, over gRPC and WebSocket.

Node and the package's node_modules come from set-up (`make setup`: npm ci); nothing here skips.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
from pathlib import Path

import pytest
from conformance.scripted_verifier import SCENARIOS, check, client_request, serve
from helpers import REPO, ModelPair, held_out_ids, start_server, stop_server

from edgespec.edge import planner as py_planner

PACKAGE = REPO / "clients" / "typescript"
DEMO = REPO / "models" / "demo"
NODE_TIMEOUT_S = 600
NEW_TOKENS = 32
HELD_OUT = 4  # prompts of prompts/heldout.jsonl compared through Serve


def npx(*args: str, timeout: float = NODE_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run(["npx", *args], cwd=PACKAGE, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module", autouse=True)
def installed():
    assert (PACKAGE / "node_modules" / ".package-lock.json").is_file(), (
        "clients/typescript/node_modules is missing: `make setup` installs it (npm ci)")


def test_unit_tests_pass():
    done = subprocess.run(["npm", "test"], cwd=PACKAGE, capture_output=True, text=True, timeout=NODE_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "# fail 0" in done.stdout or "ℹ fail 0" in done.stdout


def test_types_check():
    done = npx("tsc", "-p", "tsconfig.check.json")
    assert done.returncode == 0, done.stdout[-6000:]


# ---- the conformance kit -------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["grpc", "websocket"])
def test_conformance_kit_every_scenario(tmp_path, transport):
    manifest = json.loads((DEMO / "draft" / "manifest.json").read_text())
    fingerprint, vocab = manifest["tokenizer_fingerprint"], manifest["vocab_size"]
    server, verifier, port = serve(fingerprint, vocab, transport=transport)
    scenarios, results = tmp_path / "scenarios.jsonl", tmp_path / "results.jsonl"
    scenarios.write_text("".join(json.dumps(client_request(s, vocab)) + "\n" for s in SCENARIOS))
    address = f"127.0.0.1:{port}" if transport == "grpc" else f"ws://127.0.0.1:{port}"
    try:
        done = npx("tsx", "conformance/run.ts", "--address", address, "--fingerprint", fingerprint,
                   "--vocab-size", str(vocab), "--scenarios", str(scenarios), "--results", str(results))
    finally:
        server.stop(grace=None)
    assert done.returncode == 0, done.stderr[-3000:]
    reported = {line["scenario"]: line for line in map(json.loads, results.read_text().splitlines())}
    report = verifier.report()
    failures = {s.name: check(s, report.get(s.name), reported.get(s.name, {"error": "NOT_RUN"})) for s in SCENARIOS}
    assert {name: why for name, why in failures.items() if why} == {}
    assert len(failures) == 21


# ---- the planner: the same decisions as edge/planner.py --------------------------------------------


def planner_script(seed: int) -> list[dict]:
    """Requests as a driver would make them (events, and a decision after each), with random
    timings, acceptances, shadows and probes; each event as edge/planner.py's and as the TS planner's."""
    rng = random.Random(seed)
    steps: list[dict] = []

    def event(py, ts: dict) -> None:
        steps.append({"py": py, "event": ts})

    def decide(current, remaining: int) -> None:
        steps.append({"decide": {"current": current, "remaining": remaining}})

    for request in range(12):
        budget, max_k = rng.choice([16, 64, 200]), rng.choice([4, 8, 16])
        k = rng.choice(["auto", "auto", 3])
        send_ahead = rng.choice(["auto", "auto", 1, 2])
        event(py_planner.Start(budget, max_k, k, send_ahead), {"kind": "start", "maxNewTokens": budget, "maxK": max_k, "k": k, "sendAhead": send_ahead})
        if rng.random() < 0.5:
            info = (rng.uniform(0, 30), rng.uniform(0, 20), rng.uniform(0, 25), rng.choice([None, rng.uniform(1, 120)]))
            event(py_planner.Info(*info), {"kind": "info", "forwardMs": info[0], "decodeMs": info[1], "streamMs": info[2], "rttMs": info[3]})
        decide(None, budget)
        path, remaining = rng.choice(["speculative", "cloud_only"]), budget
        while remaining > 0:
            event(py_planner.Segment(py_planner.Path(path)), {"kind": "segment", "path": path})
            for _ in range(rng.randint(1, 8)):
                if path == "speculative":
                    k_round = rng.randint(1, max_k)
                    accepted = rng.randint(0, k_round)
                    wait = rng.choice([None, rng.uniform(5, 150)])
                    wall = (wait or 0) + rng.uniform(0, 10)
                    draft = rng.choice([None, rng.uniform(0.1, 5)])
                    forward = rng.uniform(0, 20)
                    event(py_planner.Round(k_round, accepted, accepted + 1, wall, wait, forward, draft),
                          {"kind": "round", "k": k_round, "accepted": accepted, "tokens": accepted + 1, "wallMs": wall,
                           "waitMs": wait, "forwardMs": forward, "draftMs": draft})
                    remaining -= accepted + 1
                else:
                    streamed = rng.randint(1, 20)
                    ms = rng.uniform(1, 40) * streamed
                    event(py_planner.Streamed(ms, streamed), {"kind": "streamed", "ms": ms, "tokens": streamed})
                    chances = [rng.choice([0.0, 1.0, rng.random()]) for _ in range(rng.randint(0, 12))]
                    draft, gap = rng.choice([None, rng.uniform(0.5, 30)]), rng.random() < 0.2
                    event(py_planner.Shadowed(tuple(chances), draft, gap), {"kind": "shadowed", "chances": chances, "draftMs": draft, "afterGap": gap})
                    if rng.random() < 0.3:
                        event(py_planner.FirstToken(rng.uniform(10, 300)), {"kind": "first_token", "ms": steps[-1]["event"].get("ms", 50.0)})
                        steps[-1]["py"] = py_planner.FirstToken(steps[-1]["event"]["ms"])
                    if rng.random() < 0.3:
                        rtt = rng.uniform(1, 120)
                        event(py_planner.Info(0.0, 0.0, 0.0, rtt), {"kind": "info", "forwardMs": 0, "decodeMs": 0, "streamMs": 0, "rttMs": rtt})
                    remaining -= streamed
                decide(path, max(remaining, 1))
                if remaining <= 0:
                    break
            path = "cloud_only" if path == "speculative" else "speculative"
    return steps


def test_planner_decides_as_edge_planner(tmp_path):
    steps = planner_script(seed=58) + planner_script(seed=7)  # (one client: the second script goes on from the first)
    script = tmp_path / "planner.jsonl"
    script.write_text("".join(json.dumps({k: v for k, v in step.items() if k != "py"}) + "\n" for step in steps))
    done = npx("tsx", "conformance/planner_replay.ts", str(script))
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    planner, ours = py_planner.Planner("auto"), []
    for step in steps:
        if "py" in step:
            planner.observe(step["py"])
        else:
            current = step["decide"]["current"]
            d = planner.decide(None if current is None else py_planner.Path(current), step["decide"]["remaining"])
            ours.append({"path": d.path.value, "k": d.k, "depth": d.depth, "spec_ms": d.spec_ms, "cloud_ms": d.cloud_ms, "reason": d.reason})
    assert len(theirs) == len(ours) > 100
    assert {d["path"] for d in ours} == {"speculative", "cloud_only"}  # the script exercised both paths' rules
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert (a["path"], a["k"], a["depth"], a["reason"]) == (b["path"], b["k"], b["depth"], b["reason"]), f"decision {i}: {a} != {b}"
        for name in ("spec_ms", "cloud_ms"):
            assert (a[name] is None) == (b[name] is None) and (a[name] is None or math.isclose(a[name], b[name], rel_tol=1e-9)), f"decision {i}: {name}"


# ---- through a real Serve verifier: the demo pair ---------------------------------------------------


@pytest.fixture(scope="module")
def demo_server():
    srv = start_server(ModelPair(DEMO / "target", DEMO / "draft-hf", DEMO / "draft"), torch_threads=1)
    try:
        yield srv
    finally:
        stop_server()


@pytest.fixture(scope="module")
def held_out(tmp_path_factory) -> Path:
    return held_out_ids(DEMO / "draft", slice(HELD_OUT), tmp_path_factory.mktemp("prompts") / "heldout.jsonl")


@pytest.fixture(scope="module")
def python_outputs(demo_server, held_out) -> dict[str, list[int]]:
    from edgespec.edge.client import EdgeClient

    rows = [json.loads(line) for line in held_out.read_text().splitlines()]
    with EdgeClient(demo_server.address, DEMO / "draft", timeout=60) as client:
        return {row["id"]: client.generate(row["prompt_ids"], max_new_tokens=NEW_TOKENS, stop_token_ids=()).token_ids for row in rows}


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["grpc", "websocket"])
@pytest.mark.parametrize("k", ["auto", "4"])
def test_greedy_output_equals_the_python_sdks(demo_server, held_out, python_outputs, transport, k):
    address = demo_server.address if transport == "grpc" else f"ws://127.0.0.1:{demo_server.http_port}"
    done = npx("tsx", "bench/generate.ts", "--address", address, "--draft", str(DEMO / "draft"), "--prompts", str(held_out),
               "--max-new-tokens", str(NEW_TOKENS), "--k", k, "--warmup", "0")
    assert done.returncode == 0, done.stderr[-3000:]
    node = {row["id"]: row for row in map(json.loads, done.stdout.splitlines())}
    assert set(node) == set(python_outputs)
    for prompt_id, expected in python_outputs.items():
        assert node[prompt_id]["token_ids"] == expected, prompt_id
        assert node[prompt_id]["finish_reason"] == "length"
    if k == "4":
        assert all(row["rounds"] < NEW_TOKENS for row in node.values())  # the draft's tokens were accepted
