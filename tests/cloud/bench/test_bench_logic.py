"""Pure logic of the benchmarks: the speedup arithmetic, token kinds, diagnosis accounting."""

from __future__ import annotations

import pytest

from edgespec.cloud.bench.diagnosis import Diagnosis, char_categories, token_categories
from edgespec.cloud.bench.theory import (
    RoundCosts,
    alpha_from_rounds,
    alpha_from_tau,
    best_k,
    expected_tau,
    predicted_speedups,
    seeds_speedup,
)
from edgespec.edge.types import RoundRecord


def test_expected_tau_and_its_inverse():
    assert expected_tau(0.0, 4) == 1.0 and expected_tau(1.0, 4) == 5.0
    for alpha in (0.2, 0.5, 0.8, 0.95):
        assert alpha_from_tau(expected_tau(alpha, 4), 4) == pytest.approx(alpha, abs=1e-6)


def test_seeds_speedup_curve():
    # a = 0.8, k = 4, c = 20: (1 - 0.8^5) / (0.2 * 1.2)
    assert seeds_speedup(0.8, 4, 20.0) == pytest.approx((1 - 0.8**5) / (0.2 * 1.2))
    assert best_k(0.9, 50.0) > best_k(0.5, 50.0)  # better drafts afford longer blocks
    assert best_k(0.8, 100.0) >= best_k(0.8, 5.0)  # cheaper drafts too


def test_alpha_from_rounds_counts_only_judged_positions():
    # (k, accepted): 4 of 4 (no failure), 1 of 4 (one failure), 0 of 2 (one failure)
    assert alpha_from_rounds([(4, 4), (4, 1), (2, 0)]) == pytest.approx(5 / 7)


def test_predictions():
    costs = RoundCosts(draft_ms_per_token=1.0, wait_ms=20.0, target_ms_per_token=15.0)
    out = predicted_speedups(tau=3.0, k=4, costs=costs)
    assert out["c"] == 15.0
    assert out["ideal"] == pytest.approx(3.0 / (1 + 4 / 15))
    assert out["cost_model"] == pytest.approx(15.0 / ((4 * 1.0 + 20.0) / 3.0))


def test_char_categories_on_a_fragment_cut_mid_file():
    text = "        x = foo(1)  # hi\n    return 'abc'\ndef g():\n    pass\n"
    kinds = char_categories(text)
    pick = lambda fragment: kinds[text.index(fragment)]  # noqa: E731
    assert pick("x =") == "identifier"
    assert pick("= foo") == "punctuation"
    assert pick("1)") == "number"
    assert pick("# hi") == "comment"
    assert pick("return") == "keyword"  # after a dedent below the first line's indentation
    assert pick("'abc'") == "string"
    assert pick("def") == "keyword"
    assert kinds[text.index("\n")] == "whitespace"


def test_char_categories_of_a_docstring_still_open_at_the_end():
    text = 'x = 1\ndef f():\n    """Return the path\n    of get'
    kinds = char_categories(text)
    assert kinds[text.index("x")] == "identifier"
    assert kinds[text.index("def")] == "keyword"
    for word in ('"""', "Return", "path", "get"):
        assert kinds[text.index(word)] == "string", word


def test_diagnosis_counts_judged_positions_and_rejections():
    vocab = {1: "x", 2: " =", 3: " 1", 4: "\n", 5: "y", 6: " +"}
    decode = lambda ids: "".join(vocab[i] for i in ids)  # noqa: E731
    generated = [1, 2, 3, 4, 5, 2]
    rounds = [
        RoundRecord(k=3, drafts=(1, 2, 3), accepted=3, next_token=4, draft_ms=1, wait_ms=1, batch_size=1),  # all + bonus
        RoundRecord(k=3, drafts=(5, 6, 6), accepted=1, next_token=2, draft_ms=1, wait_ms=1, batch_size=1),  # reject at 2
    ]
    diagnosis = Diagnosis()
    diagnosis.add(decode, [], generated, rounds)
    assert diagnosis.by_position() == {1: 1.0, 2: 0.5, 3: 1.0}
    assert diagnosis.rejected_true_tokens == {2: 1}  # the target wanted " =" where the draft said " +"
    kinds = token_categories(decode, [], generated)
    assert kinds == ["identifier", "punctuation", "number", "whitespace", "identifier", "punctuation"]
    assert diagnosis.by_kind()["punctuation"]["acceptance"] == pytest.approx(0.5)
    assert diagnosis.most_rejected(decode)[0] == {"token_id": 2, "text": " =", "rejections": 1, "rejection_rate": 0.5}
