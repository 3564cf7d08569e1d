"""The device server's pure parts: OpenAI request fields to generation parameters, stop strings."""

from __future__ import annotations

import pytest

from edgespec.edge.openai_server import RequestError, StopMatcher, generation_params


def test_openai_fields_become_generation_parameters():
    assert generation_params({"temperature": 0, "max_tokens": 7}) == {"max_new_tokens": 7}
    sampled = generation_params({"temperature": 0.7, "top_p": 0.9, "seed": 3})
    assert sampled == {"max_new_tokens": 16, "temperature": 0.7, "top_p": 0.9, "seed": 3}  # coupled mode, any k
    assert generation_params({})["temperature"] == 1.0  # OpenAI's default temperature


@pytest.mark.parametrize("body, param", [
    ({"n": 2}, "n"), ({"temperature": -1}, "temperature"), ({"temperature": "hot"}, "temperature"),
    ({"top_p": 1.5}, "top_p"), ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 2.5}, "max_tokens"),
    ({"seed": -4}, "seed"), ({"temperature": True}, "temperature"),
])
def test_bad_fields_name_themselves(body, param):
    with pytest.raises(RequestError) as caught:
        generation_params(body)
    assert caught.value.param == param and param in caught.value.message


def feed_all(stops, pieces):
    matcher = StopMatcher(stops)
    out = [matcher.feed(piece) for piece in pieces]
    return out, matcher.flush(), matcher.stopped


def test_a_stop_string_cuts_the_text_even_across_pieces():
    out, tail, stopped = feed_all(["\n\n"], ["def f():", "\n", "\n    pass"])
    assert "".join(out) + tail == "def f():" and stopped
    assert out[1] == ""  # a newline that may start the stop string is held back until it is known


def test_text_that_only_looked_like_a_stop_is_released():
    out, tail, stopped = feed_all(["END"], ["the E", "ND", "!"])
    assert "".join(out) + tail == "the " and stopped
    out, tail, stopped = feed_all(["END"], ["the E", "nd!"])
    assert "".join(out) + tail == "the End!" and not stopped
    assert feed_all([], ["a", "b"]) == (["a", "b"], "", False)


def test_the_earliest_stop_string_wins_whichever_is_listed_first():
    out, tail, stopped = feed_all(["world", "lo"], ["hello world"])
    assert "".join(out) + tail == "hel" and stopped


def test_chat_has_no_default_limit_and_max_completion_tokens_wins():
    assert generation_params({"temperature": 0}, chat=True) == {"max_new_tokens": None}
    assert generation_params({"temperature": 0, "max_completion_tokens": 5, "max_tokens": 9}, chat=True)["max_new_tokens"] == 5
    assert generation_params({"temperature": 0})["max_new_tokens"] == 16  # completions: OpenAI's 16
    assert generation_params({"temperature": 0.5, "top_k": 40})["top_k"] == 40
    assert "top_k" not in generation_params({"temperature": 0.5, "top_k": -1})  # vLLM's "off"
