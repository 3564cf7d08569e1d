"""Pure logic of the benchmarks: the speedup arithmetic, token kinds, diagnosis accounting."""

from __future__ import annotations

import json

import pytest

from edgespec.cloud.bench.diagnosis import Diagnosis, char_categories, token_categories
from edgespec.cloud.bench.theory import (
    RoundCosts,
    alpha_from_rounds,
    alpha_from_tau,
    expected_tokens,
    predicted_speedups,
    seeds_speedup,
)
from edgespec.edge.types import RoundRecord


def test_alpha_from_tau_inverts_expected_tau():
    for alpha in (0.2, 0.5, 0.8, 0.95):
        assert alpha_from_tau(expected_tokens(alpha, 4), 4) == pytest.approx(alpha, abs=1e-6)


def test_seeds_speedup_curve():
    # a = 0.8, k = 4, c = 20: (1 - 0.8^5) / (0.2 * 1.2)
    assert seeds_speedup(0.8, 4, 20.0) == pytest.approx((1 - 0.8**5) / (0.2 * 1.2))

    def seeds_best_k(alpha: float, c: float) -> int:  # the most tokens per cost on the seeds' cost: 1 + k/c target steps
        return max(range(1, 17), key=lambda k: expected_tokens(alpha, k) / (1.0 + k / c))

    assert seeds_best_k(0.9, 50.0) > seeds_best_k(0.5, 50.0)  # better drafts afford longer blocks
    assert seeds_best_k(0.8, 100.0) >= seeds_best_k(0.8, 5.0)  # cheaper drafts too


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


def test_sampling_bench_runs_every_arm_on_every_prompt_in_rotated_order():
    from types import SimpleNamespace

    from edgespec.cloud.bench.sampling import measure_arms, summary_lines
    from edgespec.edge.stats import RequestStats

    calls = []

    def result(ms_per_token):
        stats = RequestStats()
        stats.record_round(4, 2, 3, batch_size=1)
        stats.wall_s = 3 * ms_per_token / 1000
        return SimpleNamespace(stats=stats)

    def generate(prompt, **params):
        calls.append((prompt, params["name"], params.get("max_new_tokens")))
        return result(5.0 if params["name"] == "fast" else 10.0)

    def cloud_only(prompt, params):
        calls.append((prompt, "cloud-only", None))
        return result(20.0)

    clients = []

    def new_client():
        clients.append(SimpleNamespace(generate=generate, close=lambda: clients.remove(client)))
        client = clients[-1]
        return client

    harness = SimpleNamespace(new_client=new_client, cloud_only=cloud_only,
                              pair_draws=lambda key: calls.append((None, f"draws {key}", None)))
    arms = {"fast": {"name": "fast"}, "slow": {"name": "slow"}}
    out = measure_arms(harness, ["a", "b", "c"], arms, {}, lambda _: None, "test")
    # every arm's run of a text starts from that text's link draws
    names = [name for _, name, _ in calls]
    assert names[2::2] == [f"draws test/prompt {i // 3}" for i in range(9)]
    calls[:] = [call for call in calls if not call[1].startswith("draws")]
    assert [name for _, name, _ in calls] == ["fast", "slow",  # each arm's own client warms up
                                              "fast", "slow", "cloud-only", "slow", "cloud-only", "fast",
                                              "cloud-only", "fast", "slow"]
    assert [n for _, _, n in calls[:2]] == [16, 16] and not clients  # short warm-ups; every client closed
    speedups = {row["label"]: row["speedup"] for row in out["arms"]}
    assert speedups == pytest.approx({"fast": 4.0, "slow": 2.0})
    assert out["arms"][0]["speculative"]["tau"] == pytest.approx(3.0)
    report = {"config": {"drafter_k": 4}, "temperature_sweep": [{"temperature": 0.8} | out], "drafters": [{"temperature": 0.0} | out]}
    lines = summary_lines(report)
    assert "fast 4.00x tau 3.00" in lines[1] and "greedy" in lines[-1]


def test_compare_alternates_the_arms_and_pairs_their_link_draws():
    from types import SimpleNamespace

    from edgespec.cloud.bench.harness import Harness

    calls = []
    harness = object.__new__(Harness)  # no Serve: only the ordering is under test
    harness.link = SimpleNamespace(reseed=lambda key: calls.append(f"draws {key}"),
                                   wait_quiet=lambda quiet_s, timeout_s: calls.append("quiet"))
    harness.progress = lambda _: None
    harness.speculative = lambda prompt, params: calls.append(f"spec {prompt}") or prompt
    harness.cloud_only = lambda prompt, params: calls.append(f"cloud {prompt}") or prompt
    spec, cloud = harness.compare(["a", "b"], {}, "wifi")
    assert calls == ["quiet", "draws wifi/prompt 0", "spec a", "quiet", "draws wifi/prompt 0", "cloud a",
                     "quiet", "draws wifi/prompt 1", "cloud b", "quiet", "draws wifi/prompt 1", "spec b"]
    assert spec == cloud == ["a", "b"]


def test_chat_records_are_rendered_with_the_drafts_chat_template(tmp_path):
    from edgespec.cloud.bench.harness import load_prompts

    path = tmp_path / "chat.jsonl"
    rows = [{"prompt": "Name a fruit.", "messages": [{"role": "user", "content": "Name a fruit."}]}, {"prompt": "plain text"}]
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n", encoding="utf-8")
    template = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
    assert load_prompts(path, chat_template=template) == ["<|user|>Name a fruit.<|end|><|assistant|>", "plain text"]
    assert load_prompts(path) == ["Name a fruit.", "plain text"]  # no template (a plain model): the prompt's text
    path.write_text(json.dumps({"prompt": "x", "messages": [{"role": "user"}]}) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"chat\.jsonl:1: .*content"):
        load_prompts(path, chat_template=template)


def test_planner_check_control_arm_is_a_twin_left_out_of_the_faster(monkeypatch):
    """--control adds the send-ahead arm again; it prices the A/A ratio and is scored against the
    faster as k=auto is, but can never be 'the faster' path, even when noise makes it the fastest."""
    from types import SimpleNamespace

    from edgespec.cloud.bench import planner_check
    from edgespec.cloud.bench.planner_check import ALWAYS, CONTROL, TWIN, PlannerCheckConfig, markdown, row_line

    config = PlannerCheckConfig(target="t", draft="d", prompts=["a", "b"], profiles=("wifi",), control=True)
    arms, _ = planner_check._arms(config)
    assert TWIN in ALWAYS and ALWAYS[TWIN]["send_ahead"] == "auto"
    assert arms[CONTROL] == arms[TWIN] and list(arms)[-1] == CONTROL
    other = next(label for label in ALWAYS if label != TWIN)
    ms = {"auto": 6.0, other: 5.0, TWIN: 5.5, CONTROL: 4.0}  # the twin's twin is the fastest arm of the run

    def measure(harness, prompts, arms, cloud_params, progress, label):
        rows = [{"label": name, "speculative": {"ms_per_token": ms[name]}, "cloud_only_share": 0.0,
                 "ms_per_token_by_prompt": [ms[name]] * len(prompts)} for name in arms]
        return {"cloud_only": {"ms_per_token": 9.0}, "cloud_only_by_prompt": [9.0, 9.0], "arms": rows}

    monkeypatch.setattr(planner_check, "measure_arms", measure)
    harness = SimpleNamespace(use_link=lambda profile: None)
    row = planner_check.profile_row(harness, config, "wifi", lambda _: None)
    assert row["best_always"] == other and CONTROL not in row["always_ms"]
    assert row["auto_over_best"] == pytest.approx(5.0 / 6.0)
    assert row["a_over_a"] == pytest.approx(5.5 / 4.0) and row["control_ms"] == 4.0
    assert row["control_over_best"] == pytest.approx(5.0 / 4.0)  # scored against the faster without it
    assert row["auto_over_best_interval"] == pytest.approx((5.0 / 6.0, 5.0 / 6.0))  # every prompt alike: no spread
    assert row["control_over_best_interval"] == pytest.approx((1.25, 1.25))
    assert row_line(row).endswith("A/A 1.38 (1.38-1.38), the control over the faster 1.25 (1.25-1.25)")
    text = markdown({"config": {"target": "t", "draft": "d", "prompts": 2, "max_new_tokens": 128, "temperature": 0.0,
                                "load": 0, "control": True}, "profiles": [row]})
    assert "| **0.83x** | 0.83-0.83 | 1.50x | 0% | 1.38 (1.38-1.38) | 1.25 (1.25-1.25) |" in text and f"/ {CONTROL} / k=auto" in text
    config.control = False
    assert CONTROL not in planner_check._arms(config)[0]


def test_paired_interval_resamples_prompts_with_their_arms_together():
    """k=auto over the faster arm, resampled by prompt: one prompt where k=auto stalled widens the
    interval below the point figure; arms that differ by the same share on every prompt give none."""
    from edgespec.cloud.bench.planner_check import paired_interval

    steady = paired_interval([2.0, 4.0, 6.0, 8.0], [[1.0, 2.0, 3.0, 4.0], [1.5, 3.0, 4.5, 6.0]])
    assert steady == pytest.approx((0.5, 0.5))  # the texts differ, the ratio on each does not
    auto, faster = [2.0, 2.0, 2.0, 2.0, 2.0, 6.0], [2.0] * 6  # one slow prompt: 0.75 over all six
    low, high = paired_interval(auto, [faster])
    assert low < 0.75 < high and high == pytest.approx(1.0)  # resamples without the stall reach 1
    assert paired_interval(auto, [faster]) == (low, high)  # seeded: the same prompts, the same interval
    assert paired_interval([], [[]]) == (0.0, 0.0) and paired_interval([1.0], [[1.0, 2.0]]) == (0.0, 0.0)
