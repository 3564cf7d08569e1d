"""End to end through Ray Serve's gRPC proxy: ONNX draft on the client, target in a replica.

Losslessness (greedy == the target's own generate()), batching across concurrent sessions,
the sampling modes, and resuming a cut stream without losing or repeating a token.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from helpers import PROMPTS, reference_greedy

from edgespec.edge.aclient import AsyncEdgeClient
from edgespec.edge.client import EdgeClient
from edgespec.edge.errors import ConnectionFailedError
from helpers.tcp_cutter import TcpCutter

pytestmark = pytest.mark.slow

NEW_TOKENS = 24


@pytest.fixture(scope="module")
def references(server, target_model):
    with EdgeClient(server.address, server.pair.draft_dir) as client:
        prompts = [client.encode(p) for p in PROMPTS[:20]]
    return {tuple(ids): reference_greedy(target_model, ids, NEW_TOKENS) for ids in prompts}


@pytest.mark.parametrize("k", [1, 3, 8, "auto"])
def test_greedy_equals_target_generate(server, references, k):
    with EdgeClient(server.address, server.pair.draft_dir) as client:
        for prompt_ids, expected in references.items():
            result = client.generate(list(prompt_ids), max_new_tokens=NEW_TOKENS, k=k, stop_token_ids=())
            assert result.token_ids == expected, f"k={k} prompt={prompt_ids}"
            assert result.finish_reason == "length"
            stats = result.stats
            assert stats.generated == NEW_TOKENS
            # the counters agree with the rounds as the device saw them
            assert stats.rounds == len(result.rounds)
            assert stats.drafted == sum(r.k for r in result.rounds)
            assert stats.accepted == sum(r.accepted for r in result.rounds)
            # each verdict commits n + 1; k="auto" may hand some of the tokens to cloud-only streaming
            assert sum(r.accepted + 1 for r in result.rounds) + stats.cloud_only_tokens == NEW_TOKENS
            assert sum(count for _, count in result.segments) == NEW_TOKENS
            if k != "auto":
                assert stats.cloud_only_tokens == 0 and stats.rounds < NEW_TOKENS or k == 1  # the draft saves target calls
            if k != "auto":
                assert set(stats.k_history) <= set(range(1, int(k) + 1))


def test_cloud_only_generate_equals_target_generate(server, references):
    with EdgeClient(server.address, server.pair.draft_dir) as client:
        for prompt_ids, expected in list(references.items())[:5]:
            result = client.generate_cloud(list(prompt_ids), max_new_tokens=NEW_TOKENS, stop_token_ids=())
            assert result.token_ids == expected
        info = client.info(refresh=True)  # what a fresh device's planner prices the stream from
        assert info.decode_ms > 0 and info.stream_ms > 0


def test_concurrent_sessions_match_sequential_and_share_batches(server, references):
    items = list(references.items())[:12]

    async def one(prompt_ids):
        async with AsyncEdgeClient(server.address, server.pair.draft_dir) as client:
            return await client.generate(list(prompt_ids), max_new_tokens=NEW_TOKENS, k=3, stop_token_ids=())

    async def all_at_once():
        return await asyncio.gather(*(one(ids) for ids, _ in items))

    results = asyncio.run(all_at_once())
    for (prompt_ids, expected), result in zip(items, results):
        assert result.token_ids == expected
    batch_sizes = [b for r in results for b in r.stats.server_batch_sizes]
    assert max(batch_sizes) > 1, f"no round was verified together with another session: {batch_sizes}"


def test_stop_token_ends_generation(server, references):
    prompt_ids, expected = next(iter(references.items()))
    stop = expected[5]
    with EdgeClient(server.address, server.pair.draft_dir) as client:
        result = client.generate(list(prompt_ids), max_new_tokens=NEW_TOKENS, k=4, stop_token_ids=(stop,))
    cut = expected.index(stop) + 1
    assert result.token_ids == expected[:cut]
    assert result.finish_reason == "stop_token"


@pytest.mark.parametrize("mode", ["exact", "token"])
def test_sampling_modes_run_and_are_seeded(server, mode):
    with EdgeClient(server.address, server.pair.draft_dir) as client:
        params = dict(max_new_tokens=30, temperature=0.9, top_k=50, mode=mode, k=3, seed=7, stop_token_ids=())
        first = client.generate(PROMPTS[0], **params)
        again = client.generate(PROMPTS[0], **params)
        other = client.generate(PROMPTS[0], **{**params, "seed": 8})
    assert len(first.token_ids) == 30
    assert first.token_ids == again.token_ids  # same seed, same k: same draws on both sides
    assert first.token_ids != other.token_ids
    stats = first.stats
    assert stats.rounds > 0 and sum(r.accepted + 1 for r in first.rounds) == 30


def test_exact_mode_sends_q_and_token_mode_only_tokens(server):
    params = dict(max_new_tokens=20, temperature=0.9, k=3, seed=7, stop_token_ids=())
    with EdgeClient(server.address, server.pair.draft_dir) as client:
        exact = client.generate(PROMPTS[0], mode="exact", top_n=16, **params).stats
        token = client.generate(PROMPTS[0], mode="token", **params).stats
    # a Draft of 3 tokens is ~10 bytes; q adds 16 (id, prob) pairs per drafted token
    assert exact.bytes_sent / exact.rounds > 3 * token.bytes_sent / token.rounds


def test_stream_yields_text_pieces(server):
    with EdgeClient(server.address, server.pair.draft_dir) as client:
        stream = client.stream(PROMPTS[1], max_new_tokens=20, stop_token_ids=())
        pieces = list(stream)
    assert len(pieces) > 1
    assert "".join(pieces) == stream.result.text
    assert len(stream.result.token_ids) == 20


def interrupted_run_params(mode: str, seed: int) -> dict:
    """A 40-token generation to run clean and then through a broken connection."""
    params = dict(max_new_tokens=40, k=3, stop_token_ids=(), seed=seed)
    if mode == "exact":
        params.update(temperature=0.8, mode="exact")
    return params


@pytest.mark.parametrize("mode", ["greedy", "exact"])
def test_cut_stream_resumes_with_identical_output(server, mode):
    """Connections are reset mid-generation; the client re-opens from its committed tokens."""
    params = interrupted_run_params(mode, seed=11)
    with EdgeClient(server.address, server.pair.draft_dir) as client:
        clean = client.generate(PROMPTS[2], **params)
    with TcpCutter(server.grpc_port) as link:
        with EdgeClient(link.address, server.pair.draft_dir, max_retries=5) as client:
            stream = client.stream(PROMPTS[2], **params)
            for i, _ in enumerate(stream):
                if i in (2, 6):
                    link.cut_all()
            result = stream.result
        assert link.cuts >= 2
    assert result.stats.resumes >= 2
    assert result.token_ids == clean.token_ids
    assert result.text == clean.text


def test_sessions_on_the_replica_survive_a_failing_neighbour(server, references):
    """A client that vanishes mid-session does not disturb a concurrent one."""
    prompt_ids, expected = list(references.items())[3]
    outcome = {}

    def healthy():
        with EdgeClient(server.address, server.pair.draft_dir) as client:
            outcome["result"] = client.generate(list(prompt_ids), max_new_tokens=NEW_TOKENS, k=2, stop_token_ids=())

    thread = threading.Thread(target=healthy)
    thread.start()
    with TcpCutter(server.grpc_port) as link:
        with EdgeClient(link.address, server.pair.draft_dir, max_retries=0) as client:
            stream = client.stream(PROMPTS[5], max_new_tokens=200, k=2, stop_token_ids=())
            with pytest.raises(ConnectionFailedError) as caught:
                for i, _ in enumerate(stream):
                    if i == 2:
                        link.cut_all()
    # The error carries what was committed before it: nothing is silently lost.
    partial = caught.value.partial
    assert partial.finish_reason == "error" and len(partial.token_ids) >= 3
    thread.join(timeout=120)
    assert outcome["result"].token_ids == expected


def test_prometheus_metrics_count_the_work(server):
    """Drafted/accepted tokens, acceptance lengths, batch sizes and sessions reach /metrics."""
    import re
    import time
    import urllib.request

    with EdgeClient(server.address, server.pair.draft_dir) as client:
        result = client.generate(PROMPTS[4], max_new_tokens=20, k=3, stop_token_ids=())
    assert result.stats.rounds > 0
    wanted = {
        "edgespec_drafted_tokens_total",
        "edgespec_accepted_tokens_total",
        "edgespec_acceptance_length_bucket",
        "edgespec_position_drafted_total",
        "edgespec_verify_batch_size_bucket",
        "edgespec_active_sessions",
        "edgespec_generated_tokens_total",
    }
    deadline = time.monotonic() + 60  # Ray exports metrics every few seconds
    found: dict[str, float] = {}
    while time.monotonic() < deadline:
        text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
        found = {}
        for line in text.splitlines():
            match = re.match(r"(?:ray_)?(edgespec_\w+?)(?:\{.*\})? ([0-9.e+-]+)$", line)
            if match:
                found[match.group(1)] = found.get(match.group(1), 0.0) + float(match.group(2))
        if wanted <= set(found) and found["edgespec_drafted_tokens_total"] >= result.stats.drafted:
            break
        time.sleep(2)
    assert wanted <= set(found), sorted(found)
    assert found["edgespec_drafted_tokens_total"] >= result.stats.drafted
    assert found["edgespec_accepted_tokens_total"] <= found["edgespec_drafted_tokens_total"]


def test_past_the_drafts_context_the_cloud_finishes(server, target_model, tmp_path):
    """A draft that sees fewer positions than the target hands over to Generate, losslessly."""
    import dataclasses
    import shutil

    from edgespec.edge.manifest import DraftManifest

    short = tmp_path / "short-draft"
    shutil.copytree(server.pair.draft_dir, short)
    dataclasses.replace(DraftManifest.load(short), max_positions=40, graph={}).save(short)  # graph re-derived
    with EdgeClient(server.address, short) as client:
        ids = client.encode(PROMPTS[0])
        result = client.generate(ids, max_new_tokens=40, k=4, stop_token_ids=())
    assert result.token_ids == reference_greedy(target_model, ids, 40)
    assert result.stats.cloud_only_tokens > 0 and result.stats.rounds > 0


def test_replica_restart_mid_generation_is_resumed(server, references, target_model):
    """The replica is killed mid-generation; Serve starts a new one and the client resumes."""
    import ray

    prompt_ids, _ = list(references.items())[7]
    with EdgeClient(server.address, server.pair.draft_dir, max_retries=12, timeout=30) as client:
        stream = client.stream(list(prompt_ids), max_new_tokens=60, k=2, stop_token_ids=())
        for i, _ in enumerate(stream):
            if i == 3:
                names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if "Verifier" in a["name"]]
                assert names, "no replica actor found"
                for name in names:
                    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)
        result = stream.result
    assert result.stats.resumes >= 1
    assert len(result.token_ids) == 60
    assert result.token_ids == reference_greedy(target_model, list(prompt_ids), 60)


@pytest.mark.parametrize("mode", ["greedy", "exact"])
def test_output_through_a_faulty_emulated_link_equals_the_clean_run(server, mode):
    """A 4G-like link that stalls and resets connections on a schedule: same tokens as loopback."""
    from edgespec.cloud.link.emulator import LinkEmulator
    from edgespec.cloud.link.profiles import Faults, get_profile

    params = interrupted_run_params(mode, seed=3)
    with EdgeClient(server.address, server.pair.draft_dir) as client:
        clean = client.generate(PROMPTS[6], **params)
    faults = Faults(reset_after_s=0.8, stall_every_s=0.5, stall_for_s=0.2)
    with LinkEmulator(server.address, get_profile("4g"), faults=faults, seed=1) as link:
        with EdgeClient(link.address, server.pair.draft_dir, max_retries=20, timeout=10) as client:
            faulty = client.generate(PROMPTS[6], **params)
        assert link.resets >= 1
    assert faulty.stats.resumes >= 1
    assert faulty.token_ids == clean.token_ids


def test_tokenizer_mismatch_is_refused_naming_both(server, tmp_path):
    """A draft exported with another tokenizer is refused before any session opens."""
    import json
    import shutil

    from edgespec.cloud.training.tiny import corpus_text, train_tokenizer
    from edgespec.edge.errors import TokenizerMismatchError
    from edgespec.edge.tokenizer import fingerprint

    other = tmp_path / "other-draft"
    shutil.copytree(server.pair.draft_dir, other)
    tokenizer = train_tokenizer(corpus_text()[:2], vocab_size=512)
    tokenizer.save(str(other / "tokenizer.json"))
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["tokenizer_fingerprint"] = fingerprint(tokenizer)
    (other / "manifest.json").write_text(json.dumps(manifest))
    with EdgeClient(server.address, other) as client:
        with pytest.raises(TokenizerMismatchError) as caught:
            client.generate("def f(", max_new_tokens=4)
    with EdgeClient(server.address, server.pair.draft_dir) as client:
        server_fp = client.info().tokenizer_fingerprint
    assert fingerprint(tokenizer) in str(caught.value) and server_fp in str(caught.value)


def test_one_client_runs_concurrent_generations(server, references):
    """Generations on one client each get their own fork of the draft (context and cache)."""
    items = list(references.items())[:5]

    async def main():
        async with AsyncEdgeClient(server.address, server.pair.draft_dir) as client:
            return await asyncio.gather(
                *(client.generate(list(ids), max_new_tokens=NEW_TOKENS, k=3, stop_token_ids=()) for ids, _ in items)
            )

    for (ids, expected), result in zip(items, asyncio.run(main())):
        assert result.token_ids == expected
