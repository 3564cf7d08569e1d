"""Send-ahead, tree drafts, the choice between speculation and cloud-only streaming, and resuming
cloud-only generation, through the real Serve gRPC ingress."""

from __future__ import annotations

import time

import pytest
from helpers import PROMPTS, reference_greedy
from helpers.tcp_cutter import TcpCutter

from edgespec.cloud.link.emulator import LinkEmulator
from edgespec.cloud.link.profiles import Faults, LinkProfile
from edgespec.edge import driver
from edgespec.edge.client import EdgeClient

pytestmark = pytest.mark.slow

NEW_TOKENS = 32
EXTRA_PROMPTS = ["def __repr__(self):\n        return", "    for name in sorted(", "import re\nPATTERN = re.compile("]


@pytest.fixture(scope="module")
def references(server, target_model):
    with EdgeClient(server.address, server.pair.draft_dir) as client:
        prompts = [client.encode(p) for p in PROMPTS + EXTRA_PROMPTS]
    assert len(prompts) >= 24
    return {tuple(ids): reference_greedy(target_model, ids, NEW_TOKENS) for ids in prompts}


def test_info_tells_send_ahead_and_trees(server):
    with EdgeClient(server.address, server.pair.draft_dir) as client:
        info = client.info()
    assert info.send_ahead and info.max_tree_tokens == 32


@pytest.mark.parametrize("settings", [dict(k=3, send_ahead=3), dict(k=4, send_ahead=1, tree=3), dict(k=4, send_ahead=2, tree=2)],
                         ids=["send-ahead", "tree", "tree+send-ahead"])
def test_greedy_equals_target_generate(server, references, settings):
    ahead = discarded = 0
    with EdgeClient(server.address, server.pair.draft_dir) as client:
        for prompt_ids, expected in references.items():
            result = client.generate(list(prompt_ids), max_new_tokens=NEW_TOKENS, stop_token_ids=(), **settings)
            assert result.token_ids == expected, f"{settings} prompt={prompt_ids}"
            assert result.stats.cloud_only_tokens == 0  # a fixed k always speculates
            ahead += result.stats.ahead_hits
            discarded += result.stats.discarded_blocks
    if settings.get("tree"):
        assert ahead == 0  # nothing goes ahead of a tree (which of its paths holds is unknown)
    elif settings["send_ahead"] > 1:
        # both outcomes happened: blocks sent ahead were verified, and others were discarded
        assert ahead > 0 and discarded > 0, (ahead, discarded)


def test_a_tree_accepts_runner_ups_the_chain_would_have_lost(server, references):
    """Over the prompts, the tree's rounds commit more tokens per round than the chain's."""
    with EdgeClient(server.address, server.pair.draft_dir) as client:
        chain = [client.generate(list(p), max_new_tokens=NEW_TOKENS, stop_token_ids=(), k=4, send_ahead=1) for p in references]
        tree = [client.generate(list(p), max_new_tokens=NEW_TOKENS, stop_token_ids=(), k=4, send_ahead=1, tree=4) for p in references]
    chain_rounds = sum(r.stats.rounds for r in chain)
    tree_rounds = sum(r.stats.rounds for r in tree)
    assert tree_rounds < chain_rounds, (tree_rounds, chain_rounds)


@pytest.mark.parametrize("mode", ["exact", "token"])
def test_sampling_with_send_ahead_equals_without(server, mode):
    """Blocks drafted ahead use their own round's seeded draws over the context they would
    have had: with a fixed k the output is the one a run without send-ahead gives."""
    with EdgeClient(server.address, server.pair.draft_dir) as client:
        for seed in range(6):
            params = dict(max_new_tokens=40, temperature=0.9, mode=mode, k=2, seed=seed, stop_token_ids=())
            plain = client.generate(PROMPTS[seed], send_ahead=1, **params)
            ahead = client.generate(PROMPTS[seed], send_ahead=4, **params)
            assert ahead.token_ids == plain.token_ids, f"{mode} seed {seed}"


@pytest.fixture(scope="module")
def self_draft(tiny_pair, tmp_path_factory):
    """The target exported as its own draft: every greedy draft is accepted."""
    from edgespec.cloud.training.export import export_draft

    return export_draft(tiny_pair.target_dir, tmp_path_factory.mktemp("self") / "draft", log=lambda _: None).out_dir


FAST = LinkProfile("fast")  # a self-draft's block of ~16 tokens costs a few ms: speculation wins
SLOW = LinkProfile("slow", rtt_ms=250.0)  # one round trip per block, no send-ahead: cloud-only wins


def _slow_then_fast_again(server, self_draft, new_tokens: int):
    """One generation over a link that turns slow after 30 tokens and fast again once the
    planner streams cloud-only; returns (prompt ids, result)."""
    with LinkEmulator(server.address, FAST) as link, EdgeClient(link.address, self_draft, timeout=60) as client:
        ids = client.encode(PROMPTS[0])
        params = dict(lookup=False, send_ahead=1, stop_token_ids=())
        client.generate(ids, max_new_tokens=100, **params)  # the planner measures the fast link first
        stream = client.stream(ids, max_new_tokens=new_tokens, **params)
        phase, deadline = "fast", time.monotonic() + 120
        for _ in stream:
            paths = [path for path, _ in stream.segments]
            if phase == "fast" and len(stream.token_ids) >= 30:
                link.set_profile(SLOW)
                phase = "slow"
            elif phase == "slow" and paths[-1] == "cloud_only":
                link.set_profile(FAST)
                phase = "fast again"
            assert time.monotonic() < deadline
        return ids, stream.result


def test_auto_switches_back_and_forth_without_losing_a_token(server, self_draft, target_model, monkeypatch):
    """Exact on every attempt; the way back to speculation must show within two attempts.
    NOTE: when the planner comes back depends on round trips the loaded 2-core machine measures
    (issue 25: a scripted clock belongs here); one attempt in ~10 full runs stayed cloud-only."""
    monkeypatch.setattr(driver, "RTT_PROBE_INTERVAL_S", 0.1)
    new_tokens = 400
    for attempt in range(2):
        ids, result = _slow_then_fast_again(server, self_draft, new_tokens)
        assert result.token_ids == reference_greedy(target_model, ids, new_tokens)
        assert sum(n for _, n in result.segments) == new_tokens
        paths = [path for path, _ in result.segments]
        if paths[:3] == ["speculative", "cloud_only", "speculative"]:
            break
    assert paths[:3] == ["speculative", "cloud_only", "speculative"], result.segments
    assert result.stats.switches >= 2


def test_cloud_only_streaming_resumes_after_a_broken_stream(server, target_model):
    with EdgeClient(server.address, server.pair.draft_dir) as client:
        ids = client.encode(PROMPTS[3])
    expected = reference_greedy(target_model, ids, 120)
    with TcpCutter(server.grpc_port) as cutter, EdgeClient(cutter.address, server.pair.draft_dir, max_retries=5) as client:
        stream = client.stream(ids, max_new_tokens=120, speculate=False, stop_token_ids=())
        for i, _ in enumerate(stream):
            if i in (5, 40):
                cutter.cut_all()
        result = stream.result
    assert cutter.cuts >= 2 and result.stats.resumes >= 2
    assert result.token_ids == expected and result.segments == [("cloud_only", 120)]


def test_generate_cloud_resumes_through_a_link_that_resets(server, target_model):
    with EdgeClient(server.address, server.pair.draft_dir) as client:
        ids = client.encode(PROMPTS[4])
    expected = reference_greedy(target_model, ids, 150)
    slow_stream = LinkProfile("narrow", bandwidth_down_mbit=0.02)  # the reset lands mid-stream
    with LinkEmulator(server.address, slow_stream, faults=Faults(reset_after_s=0.6)) as link:
        with EdgeClient(link.address, server.pair.draft_dir, max_retries=10) as client:
            result = client.generate_cloud(ids, max_new_tokens=150, stop_token_ids=())
        assert link.resets >= 1
    assert result.token_ids == expected and result.stats.resumes >= 1


def test_a_replayed_device_makes_the_rounds_the_real_one_makes(server, target_model):
    """bench links' capacity replays devices: same rounds as the SDK with the same k, exact output."""
    from edgespec.cloud.bench.replay import make_scripts, measure_replay

    with EdgeClient(server.address, server.pair.draft_dir) as client:
        scripts = make_scripts(client, PROMPTS[:2], 32)
        real = [client.generate(s.prompt_ids, max_new_tokens=32, k=4, send_ahead=1, speculate=True, stop_token_ids=())
                for s in scripts]
        fingerprint = client.info().tokenizer_fingerprint
    for script, result in zip(scripts, real):
        assert script.output == result.token_ids == reference_greedy(target_model, script.prompt_ids, 32)
        row = measure_replay(server.address, fingerprint, [script], 1, 4)
        assert row.exact and row.tau == pytest.approx(32 / result.stats.rounds)
    many = measure_replay(server.address, fingerprint, scripts, 4, 4)
    assert many.exact and many.speculative_tokens_per_s > 0 and many.cloud_only_tokens_per_s > 0
