"""The vLLM backend alone (no Serve), on the real target SmolLM2-135M-Instruct in float32 on the CPU.

One engine for the module (~50 s to start), with a KV space of 40 blocks of 32 tokens, so that
a handful of long sessions cannot all stay cached: the eviction test needs it small.

- greedy rounds (drafts right and wrong, k = 1..8) commit exactly what transformers
  ``generate()`` and vLLM's own plain greedy decode produce;
- coupled rounds (k + 1 one-token requests through the ``CoupledRace`` logits processor) commit
  the coupled race's tokens: those a sampled decode of the engine streams for the same seed, and
  those the race draws from transformers' own logits;
- sessions verified concurrently (vLLM batches them) each commit what they commit alone;
- the cache-hit guard: a round whose context + drafts were computed before (a retried round)
  is run again without the cache, and answers the same;
- sessions whose contexts together exceed the KV space stay exact: a session whose blocks
  were evicted while it waited is recomputed, never refused.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from helpers import REPO, ensure_real_target, reference_greedy

from edgespec.cloud.serving.accept import Row
from edgespec.cloud.serving.config import VerifierConfig
from edgespec.edge.params import Mode, SamplingParams

pytestmark = pytest.mark.slow

BLOCK_BYTES = 32 * 2 * 30 * 3 * 64 * 4  # a block of 32 tokens: 30 layers, 3 KV heads of 64, K and V, fp32
KV_BLOCKS = 40
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    pending = [task for task in asyncio.all_tasks(loop) if not task.done()]  # the engine's output handler
    for task in pending:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.close()


@pytest.fixture(scope="module")
def backend(loop):
    from edgespec.cloud.serving.vllm_backend import VllmBackend

    config = VerifierConfig(model=str(ensure_real_target()), backend="vllm", device="cpu", max_context=1024, max_sessions=16,
                            max_kv_bytes=KV_BLOCKS * BLOCK_BYTES)

    async def start():  # AsyncLLM's output handler lives on the loop of its first request
        return VllmBackend(config)

    backend = loop.run_until_complete(start())
    yield backend
    backend.shutdown()


@pytest.fixture(scope="module")
def real_model():
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(str(ensure_real_target()), local_files_only=True).eval()


@pytest.fixture(scope="module")
def reference(real_model):
    """(prompt ids, new tokens) -> transformers generate() greedy continuation (float32, CPU)."""
    return lambda ids, new_tokens=NEW_TOKENS: reference_greedy(real_model, ids, new_tokens)


def chat_prompts(count: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(ensure_real_target()), local_files_only=True)
    lines = (REPO / "prompts" / "chat-heldout.jsonl").read_text().splitlines()[:count]
    return [list(tokenizer.apply_chat_template(json.loads(line)["messages"], add_generation_prompt=True, tokenize=True,
                                               return_dict=False)) for line in lines]


_keys = iter(range(1, 1 << 30))


async def speculate(backend, prompt: list[int], truth: list[int], *, wrong_every: int = 3, max_k: int = 8,
                    mode: Mode = Mode.GREEDY, sampling: SamplingParams = SamplingParams()) -> list[int]:
    """A device whose drafts follow ``truth`` but for one wrong token every ``wrong_every``-th
    round, with k cycling 1..max_k; returns what the backend commits."""
    key = next(_keys)
    await backend.open(key, prompt[:-1])
    committed, round_no = list(prompt), 0
    try:
        while len(committed) - len(prompt) < len(truth):
            done = len(committed) - len(prompt)
            k = 1 + round_no % max_k
            drafts = list(truth[done : done + k])
            if round_no % wrong_every == 0 and drafts:
                drafts[-1] = (drafts[-1] + 1) % 49152
            row = Row(key=key, cache_len=len(committed) - 1, tokens=[committed[-1], *drafts], mode=mode,
                      sampling=sampling, round_no=round_no)
            outcome = await backend.verify(row, committed[:-1])
            committed += drafts[: outcome.accepted] + [outcome.next_token]
            round_no += 1
    finally:
        backend.close(key)
    return committed[len(prompt) : len(prompt) + len(truth)]


async def plain_greedy(backend, prompt: list[int], new_tokens: int) -> list[int]:
    tokens: list[int] = []
    async for step in backend.decode(next(_keys), prompt, SamplingParams(), new_tokens, frozenset()):
        tokens += step
    return tokens


def test_greedy_rounds_commit_what_generate_and_vllm_plain_greedy_produce(backend, loop, reference):
    for prompt in chat_prompts(3):
        truth = reference(prompt)
        assert loop.run_until_complete(plain_greedy(backend, prompt, NEW_TOKENS)) == truth
        assert loop.run_until_complete(speculate(backend, prompt, truth)) == truth


def coupled_reference(model, prompt: list[int], sampling: SamplingParams, new_tokens: int) -> list[int]:
    """The coupled race on transformers' own logits: t_P = argmax p_P / E_P, token by token."""
    import torch

    from edgespec.cloud.serving.accept import target_probs
    from edgespec.edge.sampling import coupled_token

    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(new_tokens):
            probs = target_probs(model(torch.tensor([ids])).logits[0, -1:], sampling)[0].double().numpy()
            ids.append(coupled_token(probs, sampling.resolved_seed, len(ids)))
    return ids[len(prompt):]


def test_coupled_rounds_commit_the_race_s_tokens_as_generate_and_transformers_draw_them(backend, loop, real_model):
    sampling = SamplingParams(temperature=0.9, top_k=40, seed=11)
    prompt = chat_prompts(1)[0]
    truth = coupled_reference(real_model, prompt, sampling, 16)

    async def streamed() -> list[int]:
        tokens: list[int] = []
        async for step in backend.decode(next(_keys), prompt, sampling, 16, frozenset()):
            tokens += step
        return tokens

    assert loop.run_until_complete(streamed()) == truth
    assert loop.run_until_complete(speculate(backend, prompt, truth, mode=Mode.COUPLED, sampling=sampling, max_k=5)) == truth


def test_sessions_verified_together_commit_what_each_commits_alone(backend, loop, reference):
    prompts = chat_prompts(8)
    truths = [reference(prompt) for prompt in prompts]

    async def together():
        return await asyncio.gather(*(speculate(backend, p, t, wrong_every=2 + i % 3) for i, (p, t) in enumerate(zip(prompts, truths))))

    assert loop.run_until_complete(together()) == truths


def test_a_retried_round_whose_drafts_are_cached_is_recomputed_and_answers_the_same(backend, loop):
    # 60 context tokens + pending + 8 drafts = 69: its second block (tokens 32-63) ends inside the
    # drafts, so a repeat of the round would read draft rows from the cache, which have no logprobs.
    prompt = chat_prompts(1)[0]
    context = (prompt * 8)[:60]
    key = next(_keys)

    async def round_twice():
        await backend.open(key, [])
        drafts = [context[i % len(context)] for i in range(8)]
        row = Row(key=key, cache_len=60, tokens=[context[-1], *drafts], mode=Mode.GREEDY, sampling=SamplingParams(), round_no=0)
        first = await backend.verify(row, context[:-1] + [context[-1]])
        before = backend.recomputed_rounds
        again = await backend.verify(row, context[:-1] + [context[-1]])
        return first, again, backend.recomputed_rounds - before

    first, again, recomputed = loop.run_until_complete(round_twice())
    backend.close(key)
    assert recomputed == 1
    assert again == first


def test_sessions_beyond_the_kv_space_stay_exact_and_an_evicted_session_is_recomputed(backend, loop, reference):
    # Four sessions of ~420 tokens each: 1,700 tokens against a KV space of 40 x 32 = 1,280.
    base = chat_prompts(4)
    prompts = [(p * 40)[:400] + p for p in base]
    truths = [reference(p, 8) for p in prompts]

    async def interleaved():
        keys = [next(_keys) for _ in prompts]
        committed = [list(p) for p in prompts]
        for key, prompt in zip(keys, prompts):
            await backend.open(key, prompt[:-1])
        cached_first_revisit = None
        for round_no in range(3):
            for i, key in enumerate(keys):
                done = len(committed[i]) - len(prompts[i])
                drafts = truths[i][done : done + 2] + [0]
                row = Row(key=key, cache_len=len(committed[i]) - 1, tokens=[committed[i][-1], *drafts], mode=Mode.GREEDY,
                          sampling=SamplingParams(), round_no=round_no)
                cached = backend.cached_tokens
                outcome = await backend.verify(row, committed[i][:-1])
                if round_no == 1 and i == 0:  # three other sessions' prompts went through since its last round
                    cached_first_revisit = backend.cached_tokens - cached
                committed[i] += drafts[: outcome.accepted] + [outcome.next_token]
        for key in keys:
            backend.close(key)
        return [c[len(p) : len(p) + 8] for c, p in zip(committed, prompts)], cached_first_revisit

    got, cached_on_return = loop.run_until_complete(interleaved())
    assert got == truths
    assert cached_on_return is not None and cached_on_return < len(prompts[0]) - 32  # its blocks were evicted
