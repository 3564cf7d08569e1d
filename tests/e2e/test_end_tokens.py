"""Generation stops at every end token the model declares: an id named only in the draft's
generation_config.json (not in its manifest) ends a generation through Serve by default, its id
kept in token_ids and nothing of a special token in the text."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers import PROMPTS, reference_greedy

from edgespec.edge.client import EdgeClient

pytestmark = pytest.mark.slow


def test_an_end_token_from_generation_config_stops_generation(server, target_model, tmp_path):
    draft_dir = tmp_path / "draft"
    shutil.copytree(server.pair.draft_dir, draft_dir)
    with EdgeClient(server.address, draft_dir) as client:
        ids = client.encode(PROMPTS[0])
        expected = reference_greedy(target_model, ids, 24)
    stop_at = next(i for i, t in enumerate(expected) if i >= 3 and t not in expected[:i])  # its first occurrence
    (draft_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, expected[stop_at]]}))
    with EdgeClient(server.address, draft_dir) as client:
        assert expected[stop_at] in client.draft.eos_token_ids
        result = client.generate(ids, max_new_tokens=24, k=3)
        streamed = client.stream(ids, max_new_tokens=24, k=3)
        pieces = "".join(streamed)
    assert result.token_ids == expected[: stop_at + 1] and result.finish_reason == "stop_token"
    assert streamed.token_ids == result.token_ids and pieces == result.text
