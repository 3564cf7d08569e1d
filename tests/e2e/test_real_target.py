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


import pytest
from helpers import REPO, ModelPair, assert_same_or_a_float_tie, ensure_real_target, greedy_with_margins, start_server, stop_server

from edgespec.edge.client import EdgeClient

TS_PACKAGE = REPO / "clients" / "typescript"

pytestmark = pytest.mark.slow

REAL_PAIR = REPO / "models" / "smollm2-135m"
NEW_TOKENS = 40
CHATS = [
    [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
    [{"role": "user", "content": "Say hello."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a prime number."}],
]
CODE = ["def fibonacci(n):\n    ", "import os\n\nfor name in os.listdir("]
SPECIAL_TEXTS = ("<|im_end|>", "<|endoftext|>", "<|im_start|>")


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
    # generation_config's own eos list ([2, 0] after the import) decides where generate() stops
    references = [(ids, *greedy_with_margins(model, ids, NEW_TOKENS)) for ids in prompts]
    server = start_server(pair, max_sessions=8, max_batch_size=8, max_context=2048)
    yield server, references, model.generation_config.eos_token_id
    stop_server()


def test_import_recorded_every_end_token(real):
    _, _, eos = real
    assert eos == [2, 0]


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


@pytest.mark.parametrize("transport", ["grpc", "websocket"])
def test_the_typescript_client_generates_what_the_python_sdk_does(real, transport, tmp_path):
    """@edgespec/client (Node, onnxruntime-node) with the real pair's int8, vocab-mapped draft:
    the same greedy ids as the Python SDK, over gRPC and over the WebSocket route."""
    import json
    import subprocess

    server, references, _ = real
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": str(i), "prompt_ids": ids}) + "\n" for i, (ids, _, _) in enumerate(references)))
    with EdgeClient(server.address, server.pair.draft_dir) as client:
        python = [client.generate(ids, max_new_tokens=NEW_TOKENS, k=4, stop_token_ids=()).token_ids for ids, _, _ in references]
    address = server.address if transport == "grpc" else f"ws://127.0.0.1:{server.http_port}"
    done = subprocess.run(["npx", "tsx", "bench/generate.ts", "--address", address, "--draft", str(server.pair.draft_dir),
                           "--prompts", str(prompts), "--max-new-tokens", str(NEW_TOKENS), "--k", "4", "--warmup", "0"],
                          cwd=TS_PACKAGE, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    node = [json.loads(line) for line in done.stdout.splitlines()]
    assert [row["token_ids"] for row in node] == python
    assert any(row["mean_acceptance_length"] > 1 for row in node)  # the draft's tokens were accepted, not only streamed
