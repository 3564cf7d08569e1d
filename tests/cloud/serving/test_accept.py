"""The accept rule, four ways: hand-built cases, output distributions against p, a slow
reference loop against the batched path, and seeded determinism; then the target
distribution p (``target_probs``) and the batch adapter (``accept_rows``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from edgespec.cloud.serving.accept import (
    Row,
    NonFiniteLogits,
    accept_rows,
    draw_from,
    round_generator,
    target_probs,
    verify_greedy,
    verify_greedy_tree,
    verify_sampling,
)
from edgespec.edge.params import Mode, SamplingParams
from edgespec.edge.sampling import probs_from_logits

torch.set_num_threads(1)


def one_hot_logits(tokens: list[int], vocab: int = 6) -> torch.Tensor:
    logits = torch.zeros(len(tokens), vocab)
    for i, t in enumerate(tokens):
        logits[i, t] = 5.0
    return logits


# ---- 1. hand-built cases with one right answer -------------------------------------------


def test_greedy_accepts_matching_prefix_and_corrects_first_mismatch():
    # target argmax per position: 1, 2, 3, 4 ; drafts 1, 2, 5
    assert verify_greedy([1, 2, 5], [1, 2, 3, 4]) == (2, 3)


def test_greedy_all_accepted_gives_bonus_token():
    assert verify_greedy([1, 2, 3], [1, 2, 3, 4]) == (3, 4)


def test_greedy_first_token_wrong_and_no_drafts():
    assert verify_greedy([2, 2, 3], [1, 2, 3, 4]) == (0, 1)
    assert verify_greedy([], [7]) == (0, 7)  # a round without drafts: the target's next token


def test_sampling_certain_cases():
    vocab = 5
    p = torch.zeros(1, 3, vocab)
    p[0, 0, 2] = 1.0  # the target is sure of token 2, then of token 4, bonus 1
    p[0, 1, 4] = 1.0
    p[0, 2, 1] = 1.0
    q = torch.full((1, 2, vocab), 1.0 / vocab, dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    # drafts 2, 4: both certain under p -> accepted, bonus 1
    accepted, next_token = verify_sampling(torch.tensor([[2, 4]]), q, p, torch.tensor([2]), [gen])
    assert (accepted.item(), next_token.item()) == (2, 1)
    # draft 3 has p = 0: always rejected, recovered token is 2 (the only residual mass)
    for mode_q in (q, None):
        accepted, next_token = verify_sampling(torch.tensor([[3, 4]]), mode_q, p, torch.tensor([2]), [torch.Generator().manual_seed(1)])
        assert (accepted.item(), next_token.item()) == (0, 2)


def test_draft_token_with_zero_q_is_rejected():
    p = torch.full((1, 2, 4), 0.25)
    q = torch.tensor([[[0.0, 0.5, 0.5, 0.0]]], dtype=torch.float64)
    accepted, _ = verify_sampling(torch.tensor([[0]]), q, p, torch.tensor([1]), [torch.Generator().manual_seed(0)])
    assert accepted.item() == 0


def test_exponential_race_never_picks_zero_weight():
    gen = torch.Generator().manual_seed(3)
    weights = torch.tensor([0.0, 1e-12, 0.0, 3.0], dtype=torch.float64)
    picks = {draw_from(weights, torch.empty(4, dtype=torch.float64).exponential_(generator=gen)) for _ in range(200)}
    assert picks <= {1, 3}


# ---- 2. the output distribution equals p ---------------------------------------------------

VOCAB = 5
P = torch.tensor(
    [
        [0.40, 0.25, 0.15, 0.15, 0.05],
        [0.10, 0.50, 0.20, 0.10, 0.10],
        [0.30, 0.10, 0.10, 0.30, 0.20],
        [0.20, 0.20, 0.20, 0.20, 0.20],
    ]
)
Q = torch.tensor(
    [
        [0.10, 0.10, 0.60, 0.10, 0.10],
        [0.30, 0.30, 0.00, 0.20, 0.20],
        [0.25, 0.25, 0.25, 0.15, 0.10],
        [0.05, 0.05, 0.10, 0.40, 0.40],
    ],
    dtype=torch.float64,
)


def emitted_sequences(mode: str, k: int, trials: int, length: int) -> list[list[int]]:
    """Runs rounds for ``trials`` independent sequences at once until each has ``length`` tokens.

    Drafts are sampled from Q, the context-free p is P[position]; every round of every trial is
    one row of one batched call, with its own generator seeded by (trial, round).
    """
    outs: list[list[int]] = [[] for _ in range(trials)]
    round_no = 0
    draft_gen = torch.Generator().manual_seed(10_000 + k)
    while True:
        active = [t for t in range(trials) if len(outs[t]) < length]
        if not active:
            return [out[:length] for out in outs]
        positions = [[min(len(outs[t]) + i, len(P) - 1) for i in range(k + 1)] for t in active]
        p = torch.stack([P[pos] for pos in positions])  # [B, k+1, V]
        q = torch.stack([Q[pos[:k]] for pos in positions])  # [B, k, V]
        drafts = torch.multinomial(q.reshape(-1, VOCAB).float(), 1, generator=draft_gen).reshape(len(active), k)
        num = torch.full((len(active),), k)
        if mode == "greedy":
            verdicts = [verify_greedy(drafts[b].tolist(), p[b].argmax(-1).tolist()) for b in range(len(active))]
            accepted, nxt = torch.tensor(verdicts).T
        else:
            gens = [round_generator(t, round_no) for t in active]
            accepted, nxt = verify_sampling(drafts, q if mode == "exact" else None, p, num, gens)
        for b, t in enumerate(active):
            outs[t] += drafts[b, : accepted[b].item()].tolist() + [nxt[b].item()]
        round_no += 1


@pytest.mark.parametrize("mode", ["exact", "token"])
@pytest.mark.parametrize("k", [1, 3])
def test_sampling_output_follows_target_distribution(mode, k):
    trials = 6000
    first = torch.zeros(VOCAB)
    second = torch.zeros(VOCAB)
    for seq in emitted_sequences(mode, k, trials, 2):
        first[seq[0]] += 1
        second[seq[1]] += 1
    for position, counts in ((0, first), (1, second)):
        result = chisquare(counts.numpy(), (P[position] * trials).numpy())
        assert result.pvalue > 1e-3, f"{mode} k={k} position {position}: {counts.tolist()} vs p={P[position].tolist()}"


def test_sampling_detects_a_wrong_rule():
    """The goodness-of-fit check above can fail: accepting every draft follows q, not p."""
    trials = 6000
    counts = torch.zeros(VOCAB)
    gen = torch.Generator().manual_seed(0)
    for _ in range(trials):
        counts[torch.multinomial(Q[0].float(), 1, generator=gen).item()] += 1
    assert chisquare(counts.numpy(), (P[0] * trials).numpy()).pvalue < 1e-6


def test_greedy_output_is_target_argmax():
    for seq in emitted_sequences("greedy", 3, 50, 4):
        assert seq == [int(P[i].argmax()) for i in range(4)]


# ---- 3. a slow reference loop checks the batched path (greedy: a packed batch, ``accept_rows``) ----


def reference_verify(drafts: list[int], q: torch.Tensor | None, p: torch.Tensor, gen: torch.Generator) -> tuple[int, int]:
    """One row, token by token, in the textbook form (same draw order as the fast path)."""
    k = len(drafts)
    uniforms = torch.rand(k, generator=gen, dtype=torch.float64)
    exponentials = torch.empty(p.shape[-1], dtype=torch.float64).exponential_(generator=gen)
    for i, x in enumerate(drafts):
        q_x = 1.0 if q is None else float(q[i, x])
        ratio = float(p[i, x]) / q_x if q_x > 0 else 0.0
        if not uniforms[i].item() < ratio:
            if q is None:
                residual = p[i].double().clone()
                residual[x] = 0
            else:
                residual = (p[i].double() - q[i]).clamp_min(0)
            if residual.sum() <= 0:
                residual = p[i].double()
            return i, int((residual / exponentials).argmax())
    return k, int((p[k].double() / exponentials).argmax())


@pytest.mark.parametrize("mode", ["exact", "token", "greedy"])
def test_batched_path_matches_reference_loop(mode):
    torch.manual_seed(0)
    batch, max_k, vocab = 7, 5, 11
    ks = [5, 1, 3, 0, 4, 2, 5]
    logits = torch.randn(batch, max_k + 1, vocab) * 2
    p = torch.softmax(logits, -1)
    q = torch.softmax(torch.randn(batch, max_k, vocab, dtype=torch.float64), -1)
    drafts = torch.zeros(batch, max_k, dtype=torch.long)
    for b, k in enumerate(ks):
        drafts[b, :k] = torch.multinomial(q[b, :k].float(), 1).squeeze(1) if k else drafts[b, :0]
    for b in (0, 4):  # make some rows agree with the target's argmax for greedy
        drafts[b, :3] = logits[b, :3].argmax(-1)
    num = torch.tensor(ks)
    if mode == "greedy":
        rows = [make_row(b, Mode.GREEDY, drafts[b, :k].tolist()) for b, k in enumerate(ks)]
        row_logits = [logits[b, : k + 1] for b, k in enumerate(ks)]
        outcomes = accept_rows(rows, row_logits, torch.cat(row_logits))
        for b, k in enumerate(ks):
            n = 0
            while n < k and drafts[b, n] == logits[b, n].argmax():
                n += 1
            assert (outcomes[b].accepted, outcomes[b].next_token) == (n, logits[b, n].argmax().item())
        return
    q_in = q if mode == "exact" else None
    gens = [round_generator(b, 7) for b in range(batch)]
    accepted, nxt = verify_sampling(drafts, q_in, p, num, gens)
    for b, k in enumerate(ks):
        expected = reference_verify(drafts[b, :k].tolist(), None if q_in is None else q[b], p[b], round_generator(b, 7))
        assert (accepted[b].item(), nxt[b].item()) == expected


# ---- 4. seeded determinism ---------------------------------------------------------------


def test_same_seed_and_round_same_verdict_different_rounds_differ():
    p = torch.softmax(torch.randn(1, 4, 50), -1)
    q = torch.softmax(torch.randn(1, 3, 50, dtype=torch.float64), -1)
    drafts = torch.tensor([[1, 2, 3]])

    def verdict(seed, round_no):
        return tuple(t.item() for t in verify_sampling(drafts, q, p, torch.tensor([3]), [round_generator(seed, round_no)]))

    assert verdict(42, 5) == verdict(42, 5)
    outcomes = {verdict(42, r) for r in range(40)}
    assert len(outcomes) > 1


def test_verdict_does_not_depend_on_batch_neighbours():
    torch.manual_seed(1)
    p = torch.softmax(torch.randn(3, 4, 20), -1)
    q = torch.softmax(torch.randn(3, 3, 20, dtype=torch.float64), -1)
    drafts = torch.randint(0, 20, (3, 3))
    alone = verify_sampling(drafts[1:2], q[1:2], p[1:2], torch.tensor([3]), [round_generator(9, 2)])
    together = verify_sampling(drafts, q, p, torch.tensor([3, 3, 3]), [round_generator(s, 2) for s in (8, 9, 10)])
    assert (alone[0].item(), alone[1].item()) == (together[0][1].item(), together[1][1].item())


# ---- the target distribution p --------------------------------------------------------------


@pytest.mark.parametrize(
    "temperature,top_k,top_p",
    [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 5, 1.0), (1.0, 0, 0.9), (0.8, 20, 0.5), (2.0, 1, 1.0)],
)
def test_cloud_and_edge_distributions_agree(temperature, top_k, top_p):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 64, generator=gen) * 3
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    cloud = target_probs(logits, params)
    for row in range(logits.shape[0]):
        edge = probs_from_logits(logits[row].numpy(), params)
        np.testing.assert_allclose(cloud[row].numpy(), edge, atol=1e-6)
        assert ((cloud[row] > 0).numpy() == (edge > 0)).all()


def test_top_p_boundary_keeps_the_smallest_set():
    logits = torch.tensor([[0.5, 0.3, 0.2]]).log()
    probs = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.8))
    assert (probs[0] > 0).tolist() == [True, True, False]


def test_top_k_keeps_exactly_k_on_ties():
    probs = target_probs(torch.zeros(1, 10), SamplingParams(temperature=1.0, top_k=3))
    assert int((probs > 0).sum()) == 3


def test_greedy_has_no_sampling_distribution():
    with pytest.raises(ValueError, match="argmax"):
        target_probs(torch.zeros(1, 4), SamplingParams())


# ---- the batch adapter: rows of mixed modes -> one call per mode ------------------------------


def make_row(key: int, mode: Mode, drafts: list[int], *, seed: int = 0, round_no: int = 0, q=None, temperature=1.0) -> Row:
    sampling = SamplingParams() if mode is Mode.GREEDY else SamplingParams(temperature=temperature, seed=seed)
    return Row(key=key, cache_len=0, tokens=[0] + drafts, mode=mode, sampling=sampling, round_no=round_no, q=q)


def test_accept_rows_keeps_the_callers_order_across_modes():
    vocab = 6
    greedy_logits = one_hot_logits([1, 2, 3, 4], vocab)
    rows = [
        make_row(1, Mode.GREEDY, [1, 2, 5]),
        make_row(2, Mode.TOKEN, [3], seed=4),
        make_row(3, Mode.GREEDY, [1, 2, 3]),
        make_row(4, Mode.EXACT, [2], seed=5, q=[([2, 3], [0.5, 0.5])]),
    ]
    logits = [greedy_logits, torch.randn(2, vocab), greedy_logits, torch.randn(2, vocab)]
    results = accept_rows(rows, logits)
    assert results[0][:2] == (2, 3) and results[2][:2] == (3, 4)  # greedy rows, in their places
    for i in (1, 3):  # a sampling row alone gives the verdict it gets in the mixed batch
        assert accept_rows([rows[i]], [logits[i]]) == [results[i]]


def test_accept_rows_matches_the_rule_on_one_row():
    vocab = 7
    torch.manual_seed(3)
    logits = torch.randn(4, vocab)
    row = make_row(1, Mode.EXACT, [2, 5, 1], seed=9, round_no=4, q=[([2, 5], [0.6, 0.4]), ([5], [1.0]), ([1, 0], [0.7, 0.3])])
    q = torch.zeros(1, 3, vocab, dtype=torch.float64)
    for i, (ids, probs) in enumerate(row.q):
        q[0, i, ids] = torch.tensor(probs, dtype=torch.float64)
    p = target_probs(logits, row.sampling)[None]
    expected = verify_sampling(torch.tensor([[2, 5, 1]]), q, p, torch.tensor([3]), [round_generator(9, 4)])
    assert accept_rows([row], [logits]) == [(expected[0].item(), expected[1].item(), None, None)]


def test_accept_rows_pads_rows_of_different_k():
    logits_long = one_hot_logits([1, 2, 3, 4, 5], 8)
    logits_short = one_hot_logits([6, 7], 8)
    results = accept_rows(
        [make_row(1, Mode.GREEDY, [1, 2, 3, 4]), make_row(2, Mode.GREEDY, [6])], [logits_long, logits_short]
    )
    assert [r[:2] for r in results] == [(4, 5), (1, 7)]


# ---- trees --------------------------------------------------------------------------------


def test_tree_follows_the_branch_the_target_agrees_with():
    #          pending
    #         /       \
    #   0: 5 (x)     1: 6 (ok)
    #                /      \
    #          2: 7 (x)    3: 8 (ok)
    tokens, parents = [5, 6, 7, 8], [-1, -1, 1, 1]
    # argmax after: pending, node0, node1, node2, node3
    argmax = [6, 0, 8, 0, 9]
    assert verify_greedy_tree(tokens, parents, argmax) == ([1, 3], 9)
    assert verify_greedy_tree(tokens, parents, [4, 0, 0, 0, 0]) == ([], 4)  # nothing matches: the correction


def test_tree_verdict_equals_its_best_branch_verified_as_a_chain():
    torch.manual_seed(5)
    for _ in range(200):
        vocab = 4
        parents, tokens = [], []
        for _ in range(6):
            i = len(tokens)
            parent = int(torch.randint(-1, i, ()).item()) if i else -1
            taken = {t for t, p in zip(tokens, parents) if p == parent}
            free = [t for t in range(vocab) if t not in taken]
            if not free:
                continue
            parents.append(parent)
            tokens.append(free[int(torch.randint(0, len(free), ()).item())])
        argmax = torch.randint(0, vocab, (len(tokens) + 1,)).tolist()
        path, token = verify_greedy_tree(tokens, parents, argmax)
        # every root-to-leaf branch, as a chain through verify_greedy on the branch's argmax
        best = ([], argmax[0])
        for leaf in range(len(tokens)):
            branch, at = [], leaf
            while at >= 0:
                branch.insert(0, at)
                at = parents[at]
            n, nxt = verify_greedy([tokens[i] for i in branch], [argmax[at + 1] for at in [-1] + branch])
            if n > len(best[0]):
                best = (branch[:n], nxt)
        assert (path, token) == best, (tokens, parents, argmax)


def test_accept_rows_gives_a_tree_row_its_path():
    logits = one_hot_logits([6, 0, 8, 0, 9], 10)  # rows: pending, then each node
    row = Row(key=1, cache_len=0, tokens=[0, 5, 6, 7, 8], mode=Mode.GREEDY, sampling=SamplingParams(),
              round_no=0, parents=[-1, -1, 1, 1])
    assert row.tree == [-1, 0, 0, 2, 2]
    (outcome,) = accept_rows([row], [logits])
    assert (outcome.accepted, outcome.next_token, outcome.path) == (2, 9, [1, 3])


def test_a_packed_greedy_batch_gives_the_same_outcomes_as_its_rows_alone():
    """The batch-level greedy path (one argmax over the packed logits) against each row's own
    argmax, on random logits with near-right drafts."""
    gen = torch.Generator().manual_seed(11)
    vocab = 5
    rows, logits = [], []
    for key in range(40):
        k = int(torch.randint(1, 6, (1,), generator=gen))
        row_logits = torch.randn(k + 1, vocab, generator=gen)
        best = row_logits.argmax(-1).tolist()
        drafts = [b if torch.rand(1, generator=gen) < 0.7 else (b + 1) % vocab for b in best[:k]]
        rows.append(make_row(key, Mode.GREEDY, drafts))
        logits.append(row_logits)
    tree = Row(key=99, cache_len=0, tokens=[0, 1, 2, 3], mode=Mode.GREEDY, sampling=SamplingParams(), round_no=0, parents=[-1, -1, 0])
    rows.append(tree)
    logits.append(torch.randn(4, vocab, generator=gen))
    expected = accept_rows(rows, logits)
    assert accept_rows(rows, logits, torch.cat(logits)) == expected
    bad = torch.cat(logits)
    bad[3, 0] = float("nan")
    with pytest.raises(NonFiniteLogits):
        accept_rows(rows, logits, bad)
