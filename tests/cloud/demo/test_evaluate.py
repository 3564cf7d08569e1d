"""The offline acceptance simulation (edgespec.cloud.demo.evaluate)."""

from __future__ import annotations

import torch
import pytest
from transformers import AutoModelForCausalLM

from edgespec.cloud.training.continuation import continue_prompts
from edgespec.cloud.training.simulate_acceptance import Acceptance, simulate_greedy
from edgespec.edge.lookup import LookupConfig, lookup_next

torch.set_num_threads(1)


def _reference(draft, prompt: torch.Tensor, continuation: torch.Tensor, k: int, lookup=None) -> list[int]:
    """Slow reference: no cache, the whole prefix re-run for every drafted token."""
    accepted_per_round, done = [], 0
    while done + k + 1 <= continuation.numel():
        prefix = torch.cat([prompt, continuation[:done]])
        guesses = []
        for _ in range(k):
            with torch.no_grad():
                logits = draft(input_ids=torch.cat([prefix, torch.tensor(guesses, dtype=torch.long)])[None]).logits
            found = lookup_next(prefix.tolist() + guesses, lookup) if lookup else None
            guesses.append(int(logits[0, -1].argmax()) if found is None else found)
        n = 0
        while n < k and guesses[n] == int(continuation[done + n]):
            n += 1
        accepted_per_round.append(n)
        done += n + 1
    return accepted_per_round


def test_acceptance_counters():
    stats = Acceptance(k=4)
    for n in (4, 0, 2):
        stats.add_round(n)
    assert stats.tau == pytest.approx((5 + 1 + 3) / 3)
    assert stats.acceptance_rate == pytest.approx(6 / 12)
    assert stats.per_position == pytest.approx([2 / 3, 2 / 3, 1 / 3, 1 / 3])


@pytest.mark.parametrize("k,lookup", [(1, None), (3, None), (4, None), (4, LookupConfig(max_n=3, min_n=1))])
def test_cached_simulation_equals_reference(tiny_pair, k, lookup):
    target = AutoModelForCausalLM.from_pretrained(str(tiny_pair.target_dir)).eval()
    draft = AutoModelForCausalLM.from_pretrained(str(tiny_pair.draft_hf_dir)).eval()
    prompt = torch.randint(1, 500, (12,), generator=torch.Generator().manual_seed(k))
    ids, _ = continue_prompts(target, prompt[None], 30)
    continuation = ids[0, 12:]
    expected = _reference(draft, prompt, continuation, k, lookup)
    stats = Acceptance(k)
    simulate_greedy(draft, prompt, continuation, k, stats, lookup)
    assert stats.rounds == len(expected)
    assert stats.accepted == sum(expected)
    assert 0 < stats.accepted < stats.drafted, "the tiny pair should both accept and reject"


def test_self_draft_accepts_everything(tiny_pair):
    target = AutoModelForCausalLM.from_pretrained(str(tiny_pair.target_dir)).eval()
    prompt = torch.randint(1, 500, (9,), generator=torch.Generator().manual_seed(0))
    ids, _ = continue_prompts(target, prompt[None], 21)
    stats = Acceptance(4)
    simulate_greedy(target, prompt, ids[0, 9:], 4, stats)
    assert stats.tau == 5.0 and stats.rounds == 4
