"""The draft run over a cloud-only stream (``shadow.Shadow``): all of it while that is cheap, a
bounded share of it where watching every token would cost more than ``shadow_share``."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from edgespec.edge.planner import Info, Path, Planner, PlannerConfig, Segment, Shadowed, Streamed
from edgespec.edge.shadow import SHADOW_BATCH, Shadow


class CountingDraft:
    """Proposes the last token + 1; counts the tokens it is run over (fed or re-read)."""

    def __init__(self, tokens: list[int]):
        self.tokens, self.run_over, self.caught_up = list(tokens), 0, 0

    def rollback_to(self, n: int) -> None:
        del self.tokens[n:]

    def reset(self, context: list[int]) -> None:
        self.tokens = list(context)
        self.run_over += len(context)

    def append(self, token_ids: list[int]) -> None:  # (fed in one batched forward with the next look)
        self.tokens.extend(token_ids)
        self.caught_up += len(token_ids)

    def observe(self, token_ids: list[int], lookup=None) -> list[int]:
        predicted = []
        for token in token_ids:
            predicted.append(self.tokens[-1] + 1)
            self.tokens.append(token)
        self.run_over += len(token_ids)
        return predicted


def streamed(planner: Planner, tokens: list[int], draft_ms: float) -> SimpleNamespace:
    """A cloud-only segment delivering ``tokens`` one at a time to a Shadow, as the driver does;
    each look takes ``draft_ms`` a token on the scripted clock."""
    prompt = [1, 2, 3]
    run = SimpleNamespace(draft=CountingDraft(prompt), committed=list(prompt))
    ticks = iter(range(0, 10**9))
    # Two reads a run over SHADOW_BATCH tokens (its start and its end): draft_ms per token.
    clock = lambda: next(ticks) * draft_ms * SHADOW_BATCH / 1000  # noqa: E731

    async def go():
        with ThreadPoolExecutor(1) as draft_thread:
            shadow = Shadow(run.draft, draft_thread, planner, run.committed, lookup=None, clock=clock)
            for token in tokens:
                run.committed.append(token)
                shadow.observe([token], run.committed, 4096)
                if shadow.pending is not None:  # the next token comes once this one is judged: no race
                    await asyncio.gather(shadow.pending)
            await shadow.finish(run.committed)

    asyncio.run(go())
    return run


def streaming_planner(stream_ms: float = 15.0) -> Planner:
    """A planner whose stream runs at ``stream_ms`` a token."""
    planner = Planner()
    planner.observe(Info(forward_ms=15.0, decode_ms=14.0, rtt_ms=20.0))
    planner.observe(Segment(Path.CLOUD_ONLY))
    planner.observe(Streamed(stream_ms * 10, 10))
    return planner


def test_a_draft_cheap_to_watch_runs_over_the_whole_stream():
    tokens = list(range(4, 260))  # the draft predicts every one
    run = streamed(streaming_planner(), tokens, draft_ms=0.1)
    assert run.draft.run_over == len(tokens) and run.draft.tokens == run.committed


def test_a_costly_draft_runs_over_a_bounded_share_of_the_stream_and_stays_in_step():
    """A draft that takes 1 ms a token beside a 15 ms stream (7%, over ``shadow_share``): it
    looks at ``shadow_look`` tokens of each period that keeps its share; each look catches the
    draft up on what the rest skipped (one batched forward), so it follows the whole stream."""
    planner, config = streaming_planner(), PlannerConfig()
    tokens = [(7 * i) % 101 for i in range(1024)]
    run = streamed(planner, tokens, draft_ms=1.0)
    share = config.shadow_share * 15.0 / 1.0
    assert run.draft.run_over <= len(tokens) * share + 2 * config.shadow_look + 2 * SHADOW_BATCH
    assert run.draft.run_over >= len(tokens) * share / 2
    assert run.draft.run_over + run.draft.caught_up == len(tokens) and run.draft.tokens == run.committed


class ChanceDraft(CountingDraft):
    """Sampled: gives each streamed token the chance 0.25; keeps the p(t) it was handed."""

    def observe_chances(self, token_ids: list[int], *, sampling, lookup=None, lookup_weight: float = 1.0, draws=None,
                        top_n: int = 0, target_probs=None) -> list[float]:
        self.observe(token_ids, lookup)
        self.target_probs = getattr(self, "target_probs", []) + [list(target_probs or [])]
        return [0.25] * len(token_ids)


def test_a_sampled_stream_feeds_the_planner_chances_and_the_shadows_time():
    """A sampled request's shadow reports chances (not hits) and the draft thread's time, read
    from the driver's clock."""
    from edgespec.edge.params import SamplingParams

    recorded = []

    class Recording(Planner):
        def observe(self, event):
            if isinstance(event, Shadowed):
                recorded.append((list(event.chances), event.draft_ms))

    ticks = iter(range(0, 10_000, 3))
    prompt = [1, 2, 3]
    committed = list(prompt)

    draft = ChanceDraft(prompt)

    async def go():
        with ThreadPoolExecutor(1) as draft_thread:
            shadow = Shadow(draft, draft_thread, Recording(), committed, lookup=None,
                            sampling=SamplingParams(temperature=0.8), clock=lambda: next(ticks) / 1000)
            for token in range(7, 7 + SHADOW_BATCH + 3):
                committed.append(token)
                # the stream's p(t) of each token, but for one message without it (an older server)
                shadow.observe([token], committed, 4096, None if token == 8 else [token / 100])
            await shadow.finish(committed)

    asyncio.run(go())
    # SHADOW_BATCH tokens in one run, then the 3 left at the end of the stream.
    assert [chances for chances, _ in recorded] == [[0.25] * SHADOW_BATCH, [0.25] * 3]
    assert [round(ms, 6) for _, ms in recorded] == [3.0, 3.0]
    # each token's p(t) reached the draft beside it, None where its message had none
    expected = [None if token == 8 else token / 100 for token in range(7, 7 + SHADOW_BATCH + 3)]
    assert draft.target_probs == [expected[:SHADOW_BATCH], expected[SHADOW_BATCH:]]


def test_the_draft_models_chance_is_q_of_the_streamed_token(tiny_pair):
    """``DraftModel.observe_chances``: q(token) under the request's sampling, from the same
    forward as greedy ``observe`` (which returns the argmax there), the cache kept in step."""
    import numpy as np

    from edgespec.edge.draft import DraftModel
    from edgespec.edge.params import SamplingParams
    from edgespec.edge.sampling import probs_from_logits

    draft = DraftModel(tiny_pair.draft_dir)
    sampling = SamplingParams(temperature=0.7)
    prompt, streamed_ids = [5, 6, 7], [8, 9, 10, 11]
    expected = []
    for i, token in enumerate(streamed_ids):
        logits = draft.logits_for_context(prompt + streamed_ids[:i])[-1]
        expected.append(float(probs_from_logits(logits, sampling)[token]))
    draft.reset(prompt)
    chances = draft.observe_chances(streamed_ids, sampling=sampling)
    assert np.allclose(chances, expected, rtol=1e-4, atol=1e-6)
    assert draft.tokens == prompt + streamed_ids


def test_with_the_targets_p_the_chance_is_exact_modes_acceptance_on_average(tiny_pair):
    """Given p(t) from the stream, a streamed token's chance is min(1, q(t) / p(t)): over t ~ p
    its mean is sum_v min(p, q), what exact mode accepts of a draft from q (q(t) alone averages
    sum_v p q, lower); a value no draw could have had falls back to q(t)."""
    import numpy as np

    from edgespec.edge.draft import DraftModel, exact_chance
    from edgespec.edge.params import SamplingParams
    from edgespec.edge.sampling import probs_from_logits

    draft = DraftModel(tiny_pair.draft_dir)
    sampling, prompt, token = SamplingParams(temperature=0.7), [5, 6, 7], 8
    q = probs_from_logits(draft.logits_for_context(prompt)[-1], sampling)
    draft.reset(prompt)
    assert draft.observe_chances([token], sampling=sampling, target_probs=[q[token] / 2]) == [1.0]  # q(t) > p(t)
    draft.reset(prompt)
    (chance,) = draft.observe_chances([token], sampling=sampling, target_probs=[min(1.0, 4 * q[token])])
    assert chance == pytest.approx(q[token] / min(1.0, 4 * q[token]), rel=1e-4)
    for bad in (None, 0.0, -0.5, 1.5, float("nan")):
        draft.reset(prompt)
        (fallback,) = draft.observe_chances([token], sampling=sampling, target_probs=[bad])
        assert fallback == pytest.approx(q[token], rel=1e-4)
    # The mean over t ~ p, for a p unlike q: exact mode's acceptance, above token-only's.
    p = np.roll(q, 3) * 0.5 + q * 0.5
    mean = sum(p[t] * exact_chance(q[t], p[t]) for t in range(len(p)) if p[t] > 0)
    assert mean == pytest.approx(np.minimum(p, q).sum())
    assert mean > (p * q).sum() + 0.05


def test_coupled_chances_are_exact_hits_of_the_drafts_own_coupled_choice(tiny_pair):
    """Coupled mode: the chance at a streamed token is 1 iff the draft's coupled token there
    (argmax q/E_P with the request's draws) is that token, exactly what verification would
    decide. A stream the draft itself sampled with the same draws scores all ones; the same
    text scored under other draws is the draft's own guesses under another seed."""
    from edgespec.edge.draft import DraftModel
    from edgespec.edge.params import SamplingParams
    from edgespec.edge.sampling import PositionDraws

    draft = DraftModel(tiny_pair.draft_dir)
    sampling, prompt = SamplingParams(temperature=0.9, seed=11), [5, 6, 7]
    draft.reset(prompt)
    own = draft.propose(24, sampling=sampling, rng=PositionDraws(11)).tokens  # the draft as the target
    draft.reset(prompt)
    assert draft.observe_chances(own, sampling=sampling, draws=PositionDraws(11)) == [1.0] * len(own)
    assert draft.tokens == prompt + own
    draft.reset(prompt)
    other = draft.observe_chances(own, sampling=sampling, draws=PositionDraws(12))
    assert set(other) <= {0.0, 1.0} and sum(other) < len(own)  # other draws: not the same choices


def test_a_generation_that_starts_cloud_only_has_the_draft_read_the_prompt_first():
    """The draft has not read this prompt (another request's context): the first look re-reads
    the whole context in one go, then the shadow follows every streamed token."""
    run = SimpleNamespace(draft=CountingDraft([9, 9]), committed=[1, 2, 3])
    hits = []

    class Recording(Planner):
        def observe(self, event):
            if isinstance(event, Shadowed):
                hits.extend(event.chances)

    planner = Recording()

    async def go():
        with ThreadPoolExecutor(1) as draft_thread:
            shadow = Shadow(run.draft, draft_thread, planner, run.committed, lookup=None)
            for token in (4, 5, 6):
                run.committed.append(token)
                shadow.observe([token], run.committed, 4096)
            await shadow.finish(run.committed)  # (fewer than SHADOW_BATCH: run over at the end)

    asyncio.run(go())
    assert run.draft.tokens == run.committed and run.draft.run_over == 3 + 3
    assert hits == [1.0, 1.0, 1.0]  # 4, 5 and 6 each predicted from the context before it
