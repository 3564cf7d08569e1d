"""The shared vocabulary: sampling and generation parameters refuse bad values by name."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.edge.params import MAX_TEMPERATURE, MIN_TEMPERATURE, Finish, GenerationParams, Mode, SamplingParams


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"temperature": 1e-40}, "temperature"),  # a denormal: p would be NaN
        ({"temperature": MAX_TEMPERATURE * 2}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": float("nan")}, "top_p"),
        ({"top_p": -0.2}, "top_p"),
        ({"seed": -3}, "seed"),
        ({"seed": 2**64}, "seed"),
        ({"seed": True}, "seed"),
    ],
)
def test_sampling_params_refuse_bad_values_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_the_documented_temperature_range_is_accepted():
    for t in (0.0, MIN_TEMPERATURE, 0.8, MAX_TEMPERATURE):
        assert SamplingParams(temperature=t).is_greedy == (t == 0.0)
    assert SamplingParams(top_k=np.int64(5), seed=np.uint64(2**63)).top_k == 5


def test_generation_mode_defaults_follow_temperature():
    assert GenerationParams().mode is Mode.GREEDY
    assert GenerationParams(temperature=0.7).mode is Mode.COUPLED  # position-keyed draws, tokens only
    assert GenerationParams(temperature=0.7, mode="token").mode is Mode.TOKEN
    assert GenerationParams(mode="greedy").mode == "greedy"  # a str enum: compares with its name


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"mode": "beam"}, "mode must be one of"),
        ({"mode": "exact"}, "samples: set temperature > 0"),
        ({"k": 0}, "k must be"),
        ({"k": "many"}, "k must be"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"top_n": -1}, "top_n"),
        ({"temperature": 1e-9}, "temperature"),
        ({"lookup": "sometimes"}, "lookup must be"),
        ({"lookup": "only", "tree": 2}, "lookup 'only'"),
        ({"lookup_weight": 1.5}, "lookup_weight"),
        ({"temperature": 0.8, "draft_temperature": 0}, "draft_temperature"),
        ({"temperature": 0.8, "draft_temperature": "cold"}, "draft_temperature"),
    ],
)
def test_generation_params_refuse_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GenerationParams(**kwargs)


def test_generation_params_normalise_k_and_stop_tokens():
    params = GenerationParams(k="6", stop_token_ids=[3, 4])
    assert params.k == 6 and params.stop_token_ids == (3, 4)
    assert GenerationParams(k="auto").k == "auto"


def test_sampling_view_keeps_only_what_defines_p():
    params = GenerationParams(temperature=0.5, top_k=7, top_p=0.9, seed=3, k=2, max_new_tokens=9)
    assert params.sampling == SamplingParams(0.5, 7, 0.9, 3)


def test_finish_values_are_the_sdk_names():
    assert [f.value for f in Finish] == ["none", "stop_token", "length", "context"]


def test_the_draft_samples_at_its_own_temperature():
    from edgespec.edge.params import DRAFT_TEMPERATURE_RATIO

    params = GenerationParams(temperature=0.5, top_k=7, top_p=0.9, seed=3)
    assert params.draft_sampling == SamplingParams(DRAFT_TEMPERATURE_RATIO * 0.5, 7, 0.9, 3)
    assert GenerationParams(temperature=0.5, draft_temperature=0.2).draft_sampling.temperature == 0.2
    assert GenerationParams(temperature=0.5, draft_temperature=0.2).sampling.temperature == 0.5  # p is untouched
    assert GenerationParams().draft_sampling.is_greedy


def test_the_resolved_seed_and_mode_are_what_construction_chose():
    assert SamplingParams().resolved_seed == 0  # greedy: no draws
    sampled = GenerationParams(temperature=0.8)
    assert sampled.resolved_seed == sampled.seed and 0 <= sampled.resolved_seed < 2**63
    assert sampled.resolved_mode is Mode.COUPLED and GenerationParams(mode="exact", temperature=1.0).resolved_mode is Mode.EXACT
    assert GenerationParams().resolved_mode is Mode.GREEDY
