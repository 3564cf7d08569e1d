"""The verifier on vLLM through Ray Serve's gRPC ingress, on the real pair: SmolLM2-135M-Instruct
(float32, CPU) and its shipped 3-layer draft.

Two replicas, each with its own vLLM engine (~1-2 min to start on 2 cores):

- speculative greedy through the SDK (k = 4 and k = auto) equals vLLM's own greedy decode served
  by the same replicas (cloud-only ``Generate``), and transformers ``generate()`` up to a float tie;
- concurrent sessions (vLLM batches their rounds) each equal their output alone;
- coupled sampling (the race run by a vLLM logits processor) is one text per seed whatever k,
  equal to sampled Generate's; Generate's race follows the target's distribution (a chi-square
  test on its first token); exact and token modes are refused at Open with FAILED_PRECONDITION
  naming the mode, and Info says which modes and trees the backend serves;
- a scale-down from 2 replicas to 1 moves the stopped replica's sessions (drain) and a killed
  replica's session resumes on its successor, each without losing or changing a token.
"""

from __future__ import annotations

import threading

import grpc
import pytest
from helpers import (
    REPO,
    SERVE_START_TIMEOUT_S,
    assert_same_or_a_float_tie,
    ensure_real_target,
    free_port,
    greedy_with_margins,
    stop_server,
)

from edgespec.edge.client import EdgeClient
from edgespec.edge.errors import SessionStateError

pytestmark = pytest.mark.slow

DRAFT = REPO / "models" / "smollm2-135m" / "draft"
NEW_TOKENS = 24
CHATS = [
    [{"role": "user", "content": "Give three tips for someone interested in gardening."}],
    [{"role": "user", "content": "Write a short poem about steel."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a prime number."}],
]
CODE = ["def fibonacci(n):\n    "]
KV_SPACE = 256 << 20  # per engine: the CPU's KV space (max_kv_bytes); 2 replicas share 24 GiB with the suite
# Two vLLM engines starting at once beside the rest of the suite took 260 s on 2 loaded cores.
START_TIMEOUT_S = max(SERVE_START_TIMEOUT_S, 600)


class Deployment:
    def __init__(self, config, grpc_port: int, http_port: int):
        self.config, self.grpc_port, self.http_port = config, grpc_port, http_port
        self.address = ""

    def deploy(self, replicas: int) -> None:
        from edgespec.cloud.serving.app import serve_verifier
        from edgespec.cloud.serving.config import DeploymentOptions

        self.address = serve_verifier(self.config, DeploymentOptions(num_replicas=replicas, num_cpus=0.25),
                                      grpc_port=self.grpc_port, http_port=self.http_port, timeout_s=START_TIMEOUT_S)

    def replicas(self) -> list[str]:
        import ray

        return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if "Verifier" in a["name"]]


@pytest.fixture(scope="module")
def served():
    from edgespec.cloud.serving.app import init_ray
    from edgespec.cloud.serving.config import VerifierConfig

    target = ensure_real_target()
    init_ray(num_cpus=4, metrics_export_port=free_port())
    config = VerifierConfig(model=str(target), backend="vllm", device="cpu", max_sessions=8, max_context=2048,
                            max_kv_bytes=KV_SPACE)
    deployment = Deployment(config, free_port(), free_port())
    try:
        deployment.deploy(replicas=2)
        yield deployment
    finally:  # a deployment that failed to start must not leave Ray up for the worker's next module
        stop_server()


@pytest.fixture(scope="module")
def references():
    """(prompt ids, generate()'s tokens, margins) on the transformers target, float32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    target = ensure_real_target()
    model = AutoModelForCausalLM.from_pretrained(str(target), local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(target), local_files_only=True)
    prompts = [list(tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False))
               for chat in CHATS]
    prompts += [tokenizer(text)["input_ids"] for text in CODE]
    return [(ids, *greedy_with_margins(model, ids, NEW_TOKENS)) for ids in prompts]


@pytest.mark.parametrize("k", [4, "auto"])
def test_speculative_greedy_equals_vllm_plain_greedy_and_generate(served, references, k):
    tied = 0
    with EdgeClient(served.address, DRAFT) as client:
        for ids, expected, margins in references:
            plain = client.generate_cloud(ids, max_new_tokens=NEW_TOKENS)
            result = client.generate(ids, max_new_tokens=NEW_TOKENS, k=k, speculate=True)
            assert result.token_ids == plain.token_ids  # the same engine: token for token
            tied += assert_same_or_a_float_tie(result.token_ids, expected, margins)
            assert result.stats.rounds > 0
    assert tied <= 1


def test_concurrent_sessions_each_equal_their_output_alone(served, references):
    with EdgeClient(served.address, DRAFT) as client:
        alone = [client.generate(ids, max_new_tokens=NEW_TOKENS, k=3).token_ids for ids, _, _ in references]
    together: dict[int, list[int]] = {}

    def run(i: int, ids: list[int]) -> None:
        with EdgeClient(served.address, DRAFT) as client:
            together[i] = client.generate(ids, max_new_tokens=NEW_TOKENS, k=3).token_ids

    threads = [threading.Thread(target=run, args=(i % len(references), references[i % len(references)][0]))
               for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert [together[i] for i in range(len(references))] == alone


def test_info_tells_the_modes_served_and_no_trees(served):
    with EdgeClient(served.address, DRAFT) as client:
        info = client.info(refresh=True)
    assert sorted(info.modes) == ["coupled", "greedy"]
    assert info.max_tree_tokens == 0


def test_coupled_sampling_is_one_text_per_seed_whatever_k_and_equals_generate(served, references):
    ids = references[0][0]
    params = dict(max_new_tokens=24, temperature=0.8, top_p=0.95, seed=21, stop_token_ids=())
    with EdgeClient(served.address, DRAFT) as client:
        cloud = client.generate_cloud(ids, **params).token_ids
        texts = [client.generate(ids, mode="coupled", k=k, speculate=True, **params) for k in (2, 5, "auto")]
        other = client.generate_cloud(ids, **{**params, "seed": 22}).token_ids
    assert all(result.token_ids == cloud for result in texts)
    assert all(result.stats.rounds > 0 for result in texts)
    assert other != cloud


@pytest.mark.parametrize("mode", ["exact", "token"])
def test_sampled_speculative_modes_are_refused_at_open_naming_the_mode(served, mode):
    # One retry, as a client has: the block sent right behind the Open can be mid-write when the
    # refusal ends the call, and gRPC then ends that write with INTERNAL (the refusal's status is
    # lost to the write), which the client retries; the retry's Open meets the refusal.
    with EdgeClient(served.address, DRAFT, max_retries=1) as client:
        with pytest.raises(SessionStateError) as refused:
            client.generate("Hello", max_new_tokens=8, temperature=0.8, mode=mode, k=3, speculate=True)
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert f"mode {mode}" in refused.value.details and "vllm" in refused.value.details


def test_sampled_generate_is_seeded_and_follows_the_target(served, references):
    import numpy as np
    import torch
    from scipy.stats import chisquare
    from transformers import AutoModelForCausalLM

    ids = references[0][0]
    with EdgeClient(served.address, DRAFT) as client:
        params = dict(max_new_tokens=12, temperature=1.0, top_k=6, stop_token_ids=())
        first = client.generate_cloud(ids, seed=5, **params).token_ids
        assert client.generate_cloud(ids, seed=5, **params).token_ids == first
        assert client.generate_cloud(ids, seed=6, **params).token_ids != first
    # First-token distribution over 160 seeds against softmax(top-6 logits) of the target.
    model = AutoModelForCausalLM.from_pretrained(str(ensure_real_target()), local_files_only=True).eval()
    with torch.inference_mode():
        top = model(torch.tensor([ids])).logits[0, -1].topk(6)
    p = torch.softmax(top.values.double(), -1).numpy()
    counts = dict.fromkeys(top.indices.tolist(), 0)
    samples = 160

    def draw(seeds: range) -> None:
        with EdgeClient(served.address, DRAFT) as client:
            for seed in seeds:
                token = client.generate_cloud(ids, max_new_tokens=1, temperature=1.0, top_k=6, seed=seed).token_ids[0]
                counts[token] += 1  # a token outside the top 6 fails here (KeyError)

    threads = [threading.Thread(target=draw, args=(range(1000 + i, 1000 + samples, 8),)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    observed = np.array(list(counts.values()))
    assert observed.sum() == samples
    keep = p * samples >= 5  # chi-square needs expected counts >= 5: pool the rare tokens
    observed = np.append(observed[keep], observed[~keep].sum())
    expected = np.append(p[keep], p[~keep].sum()) * samples
    if expected[-1] == 0:
        observed, expected = observed[:-1], expected[:-1]
    assert chisquare(observed, expected).pvalue > 1e-3, (observed, expected)


def test_a_scale_down_moves_sessions_without_losing_a_token(served, references):
    """2 -> 1 replicas mid-generation: the stopped replica's sessions are told to move and reopen on
    the other with their committed tokens; every output equals the clean run."""
    long = 64
    ids = references[0][0]
    with EdgeClient(served.address, DRAFT) as client:
        clean = client.generate(ids, max_new_tokens=long, k=2, stop_token_ids=()).token_ids
    results: dict[int, object] = {}
    started = threading.Barrier(4)

    def device(i: int) -> None:
        with EdgeClient(served.address, DRAFT, max_retries=12, timeout=60) as client:
            stream = client.stream(ids, max_new_tokens=long, k=2, stop_token_ids=())
            for n, _ in enumerate(stream):
                if n == 2:
                    started.wait(timeout=120)
            results[i] = stream.result

    threads = [threading.Thread(target=device, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    started.wait(timeout=180)
    served.deploy(replicas=1)
    for thread in threads:
        thread.join(timeout=300)
    assert len(results) == 3
    assert all(result.token_ids == clean for result in results.values())  # type: ignore[attr-defined]
    assert sum(result.stats.moves for result in results.values()) >= 1  # type: ignore[attr-defined]
    assert len(served.replicas()) == 1


def test_a_killed_replica_s_session_resumes_on_its_successor(served, references):
    import ray

    ids = references[1][0]
    with EdgeClient(served.address, DRAFT) as client:
        clean = client.generate(ids, max_new_tokens=48, k=2, stop_token_ids=()).token_ids
    # Retries for as long as a successor's engine may take to start on loaded cores (backoff <= 5 s).
    with EdgeClient(served.address, DRAFT, max_retries=120, timeout=60) as client:
        stream = client.stream(ids, max_new_tokens=48, k=2, stop_token_ids=())
        for i, _ in enumerate(stream):
            if i == 3:
                for name in served.replicas():
                    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)
        result = stream.result
    assert result.stats.resumes >= 1
    assert result.token_ids == clean
