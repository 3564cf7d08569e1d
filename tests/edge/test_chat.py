"""The SDK's ``chat``: messages rendered with the draft's own chat template (the device server's
rendering, one definition: openai_request.render_chat) give exactly the token ids transformers'
``apply_chat_template`` gives, on the real pair's draft; malformed messages and a draft without
a template are refused with a ValueError that says what to do."""

from __future__ import annotations

import pytest
from helpers import REPO

from edgespec.edge.client import EdgeClient

REAL_DRAFT = REPO / "models" / "smollm2-135m" / "draft"
DEMO_DRAFT = REPO / "models" / "demo" / "draft"
CHATS = [
    [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a prime number."}],
    [{"role": "user", "content": "Say hello."}, {"role": "assistant", "content": "Hello!"},
     {"role": "user", "content": "Again, in French: ça va?"}],
]


@pytest.fixture(scope="module")
def client():
    # No call reaches the server: rendering and encoding are the device's own work.
    with EdgeClient("127.0.0.1:1", REAL_DRAFT) as client:
        yield client


@pytest.mark.parametrize("messages", CHATS)
def test_chat_prompt_equals_apply_chat_template(client, messages):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(REAL_DRAFT), local_files_only=True)
    expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    expected = list(expected["input_ids"] if isinstance(expected, dict) else expected)
    assert client.chat_prompt(messages) == expected
    assert client.draft.tokenizer.decode(expected[-3:], skip_special_tokens=False).endswith("assistant\n")


@pytest.mark.parametrize("messages, fragment", [
    ([], "non-empty list"),
    ([{"content": "no role"}], "role"),
    ([{"role": "user", "content": 5}], "content"),
])
def test_malformed_messages_are_a_value_error(client, messages, fragment):
    with pytest.raises(ValueError, match=fragment):
        client.chat_prompt(messages)


def test_a_draft_without_a_chat_template_says_so():
    with EdgeClient("127.0.0.1:1", DEMO_DRAFT) as client:
        with pytest.raises(ValueError, match="no chat template"):
            client.chat([{"role": "user", "content": "hi"}])
