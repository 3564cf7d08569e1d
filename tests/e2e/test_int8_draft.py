"""An int8 draft through the real Serve gRPC path: greedy output is still the target's own
(the target decides every token; int8 only changes how often a draft is accepted)."""

from __future__ import annotations

import pytest
from helpers import PROMPTS, reference_greedy

from edgespec.edge.client import EdgeClient

pytestmark = pytest.mark.slow

NEW_TOKENS = 24


@pytest.fixture(scope="module")
def int8_draft(tiny_pair, tmp_path_factory):
    from edgespec.cloud.training.export import export_draft

    out = tmp_path_factory.mktemp("int8") / "draft"
    report = export_draft(tiny_pair.draft_hf_dir, out, quantize="int8", parity_steps=8, log=lambda _: None)
    assert report.manifest.quantization == "int8"
    return out


def test_int8_draft_gives_target_greedy_output(server, int8_draft, target_model):
    with EdgeClient(server.address, int8_draft) as client:
        for prompt in PROMPTS[:6]:
            ids = client.encode(prompt)
            result = client.generate(ids, max_new_tokens=NEW_TOKENS, k=4, stop_token_ids=(), speculate=True)
            assert result.token_ids == reference_greedy(target_model, ids, NEW_TOKENS), prompt
            assert result.stats.drafted > 0
