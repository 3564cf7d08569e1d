"""`edgespec device-server` driven by the official `openai` client against a real Serve verifier:
completions (plain, streamed, with stop strings, from token ids), chat through a chat template
and the 400 without one, models, and refused parameters; greedy text equals the target's own
greedy output. Issue 26: four chat clients at once each get what they get alone; streamed
usage, max_completion_tokens, chat to a stop or the context's end, text parts, top_k, /health,
a preflight with CORS off, and `edgespec generate --stop`. (HTTP behaviour on a scripted
client, without a verifier: tests/edge/test_device_server_http.py.)"""

from __future__ import annotations

import json
import shutil
import threading
import time

import pytest
from helpers import PROMPTS, reference_greedy

from edgespec.edge.client import EdgeClient
from edgespec.edge.openai_server import DeviceServer

pytestmark = pytest.mark.slow
openai = pytest.importorskip("openai")  # a dev dependency; the device server itself needs none

TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"


def start(server, draft_dir):
    client = EdgeClient(server.address, draft_dir)
    device = DeviceServer(("127.0.0.1", 0), client, draft_dir)
    thread = threading.Thread(target=device.serve_forever, daemon=True)
    thread.start()
    return device, client, openai.OpenAI(base_url=device.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def device(server):
    device, client, api = start(server, server.pair.draft_dir)
    yield device, client, api
    device.shutdown()
    client.close()


@pytest.fixture(scope="module")
def chat_device(server, tmp_path_factory):
    draft_dir = tmp_path_factory.mktemp("chat") / "draft"
    shutil.copytree(server.pair.draft_dir, draft_dir)
    (draft_dir / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    device, client, api = start(server, draft_dir)
    yield device, client, api
    device.shutdown()
    client.close()


def greedy_text(client, target_model, prompt: str, n: int) -> str:
    ids = client.encode(prompt)
    return client.draft.tokenizer.decode(reference_greedy(target_model, ids, n))


def test_models_lists_the_verifiers_model(device):
    device_server, client, api = device
    assert [m.id for m in api.models.list().data] == [client.info().model_id]


def test_a_greedy_completion_is_the_targets_output(device, target_model):
    _, client, api = device
    for prompt in PROMPTS[:3]:
        reply = api.completions.create(model="any", prompt=prompt, max_tokens=24, temperature=0)
        assert reply.choices[0].text == greedy_text(client, target_model, prompt, 24)
        assert reply.choices[0].finish_reason == "length"
        assert reply.usage.completion_tokens == 24 and reply.usage.prompt_tokens == len(client.encode(prompt))


def test_a_streamed_completion_arrives_in_pieces_that_add_up(device, target_model):
    _, client, api = device
    chunks = list(api.completions.create(model="any", prompt=PROMPTS[1], max_tokens=30, temperature=0, stream=True))
    assert len(chunks) > 1 and chunks[-1].choices[0].finish_reason == "length"
    assert "".join(c.choices[0].text for c in chunks) == greedy_text(client, target_model, PROMPTS[1], 30)


def test_a_stop_string_ends_the_completion_before_it(device, target_model):
    _, client, api = device
    full = greedy_text(client, target_model, PROMPTS[0], 40)
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    expected = full[: full.index(stop)]
    reply = api.completions.create(model="any", prompt=PROMPTS[0], max_tokens=40, temperature=0, stop=[stop])
    assert reply.choices[0].text == expected and reply.choices[0].finish_reason == "stop"
    streamed = api.completions.create(model="any", prompt=PROMPTS[0], max_tokens=40, temperature=0, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == expected


def test_a_prompt_of_token_ids_and_a_seeded_sample(device, target_model):
    _, client, api = device
    ids = client.encode(PROMPTS[2])
    reply = api.completions.create(model="any", prompt=ids, max_tokens=12, temperature=0)
    assert reply.choices[0].text == client.draft.tokenizer.decode(reference_greedy(target_model, ids, 12))
    a, b = (api.completions.create(model="any", prompt=PROMPTS[2], max_tokens=12, temperature=0.9, seed=7).choices[0].text
            for _ in range(2))
    assert a == b  # seeded sampling reproduces


def test_chat_without_a_template_is_a_clear_400(device):
    _, _, api = device
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(model="any", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert "chat template" in str(caught.value)


def test_chat_renders_the_template_and_streams_deltas(chat_device, target_model):
    _, client, api = chat_device
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "def main("}]
    prompt = "<system>be brief\n<user>def main(\n<assistant>"
    expected = greedy_text(client, target_model, prompt, 16)
    reply = api.chat.completions.create(model="any", messages=messages, max_tokens=16, temperature=0)
    assert reply.choices[0].message.content == expected and reply.choices[0].message.role == "assistant"
    chunks = list(api.chat.completions.create(model="any", messages=messages, max_tokens=16, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected


@pytest.mark.parametrize("fields, param", [({"n": 2}, "n"), ({"temperature": 5}, "temperature"), ({"top_p": -1}, "top_p")])
def test_refused_parameters_name_themselves(device, fields, param):
    _, _, api = device
    with pytest.raises(openai.BadRequestError) as caught:
        api.completions.create(model="any", prompt="x", max_tokens=4, **fields)
    assert param in str(caught.value)


@pytest.mark.parametrize("length, status", [("-1", 400), ("lots", 400), (str(64 << 20), 413)])
def test_a_bad_content_length_is_refused_without_reading(device, length, status):
    import http.client
    from urllib.parse import urlparse

    url = urlparse(device[0].url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    connection.putrequest("POST", "/v1/completions")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", length)
    connection.endheaders()  # and no body: a server that tried to read it would hang
    response = connection.getresponse()
    body = response.read()
    assert response.status == status
    assert (b"Content-Length" if status == 400 else b"16 MiB") in body
    connection.close()


# ---- issue 26: fields apps rely on, concurrency ----------------------------------------------

CHATS = [[{"role": "user", "content": prompt}] for prompt in PROMPTS[:4]]


def chat_prompt(messages) -> str:
    return "".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<assistant>"


def test_four_concurrent_chat_clients_get_what_each_gets_alone(chat_device, target_model):
    device_server, client, api = chat_device
    alone = [api.chat.completions.create(model="any", messages=m, max_tokens=24, temperature=0).choices[0].message.content
             for m in CHATS]
    for messages, text in zip(CHATS, alone):
        assert text == greedy_text(client, target_model, chat_prompt(messages), 24)
    # Each client reads its first piece, then waits for the other three: four generations are
    # under way at once (with fewer slots the barrier would break), each on its own draft cache.
    barrier, texts, errors = threading.Barrier(len(CHATS), timeout=120), [None] * len(CHATS), []

    def converse(i: int) -> None:
        try:
            with openai.OpenAI(base_url=device_server.url + "/v1", api_key="unused", max_retries=0, timeout=120) as own:
                chunks = iter(own.chat.completions.create(model="any", messages=CHATS[i], max_tokens=24, temperature=0,
                                                          stream=True))
                pieces = [next(chunks).choices[0].delta.content or ""]
                barrier.wait()
                pieces += [c.choices[0].delta.content or "" for c in chunks]
                texts[i] = "".join(pieces)
        except Exception as exc:  # noqa: BLE001  (reported below, with the others)
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=converse, args=(i,)) for i in range(len(CHATS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    assert not errors, errors
    assert texts == alone
    deadline = time.monotonic() + 30  # each slot is given back just after its reply's last byte
    while device_server.gate.active and time.monotonic() < deadline:
        time.sleep(0.01)
    assert device_server.gate.active == 0


def test_streamed_usage_max_completion_tokens_and_stop_with_the_openai_client(chat_device, target_model):
    _, client, api = chat_device
    messages = CHATS[1]
    expected = greedy_text(client, target_model, chat_prompt(messages), 10)
    chunks = list(api.chat.completions.create(model="any", messages=messages, max_completion_tokens=10, temperature=0,
                                              stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert chunks[-1].usage.prompt_tokens == len(client.encode(chat_prompt(messages)))
    assert all(c.usage is None for c in chunks[:-1])
    stop = expected[len(expected) // 2 : len(expected) // 2 + 2]
    reply = api.chat.completions.create(model="any", messages=messages, max_completion_tokens=10, temperature=0, stop=stop)
    assert reply.choices[0].message.content == expected[: expected.index(stop)]
    assert reply.choices[0].finish_reason == "stop"


def test_chat_without_max_tokens_runs_to_a_stop_or_the_contexts_end(chat_device):
    _, client, api = chat_device
    reply = api.chat.completions.create(model="any", messages=CHATS[2], temperature=0)
    assert reply.usage.completion_tokens > 16  # not the legacy completions default
    if reply.choices[0].finish_reason == "length":
        assert reply.usage.total_tokens == min(client.info().max_context,
                                               reply.usage.prompt_tokens + client.info().max_new_tokens)
    else:
        assert reply.choices[0].finish_reason == "stop"


def test_content_as_text_parts_and_a_refused_image_part(chat_device):
    _, _, api = chat_device
    as_string = api.chat.completions.create(model="any", messages=[{"role": "user", "content": "def a(\ndef b("}],
                                            max_tokens=8, temperature=0)
    parts = [{"type": "text", "text": "def a("}, {"type": "text", "text": "def b("}]
    as_parts = api.chat.completions.create(model="any", messages=[{"role": "user", "content": parts}], max_tokens=8,
                                           temperature=0)
    assert as_parts.choices[0].message.content == as_string.choices[0].message.content
    image = parts + [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(model="any", messages=[{"role": "user", "content": image}], max_tokens=8)
    assert "'image_url' part" in str(caught.value)


def test_top_k_1_sampling_is_the_greedy_output(chat_device, target_model):
    """top_k reaches the verifier: with k = 1 the target's distribution is a point mass on its argmax."""
    _, client, api = chat_device
    messages = CHATS[3]
    reply = api.chat.completions.create(model="any", messages=messages, max_tokens=16, temperature=1.0, seed=5,
                                        extra_body={"top_k": 1})
    assert reply.choices[0].message.content == greedy_text(client, target_model, chat_prompt(messages), 16)


def test_health_and_a_browser_preflight(chat_device):
    import http.client
    from urllib.parse import urlparse

    url = urlparse(chat_device[0].url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    connection.request("GET", "/health")
    response = connection.getresponse()
    assert response.status == 200 and json.loads(response.read())["status"] == "ok"
    connection.request("OPTIONS", "/v1/chat/completions", headers={
        "Origin": "http://localhost:5173", "Access-Control-Request-Method": "POST"})
    response = connection.getresponse()
    response.read()
    assert response.status == 403 and response.getheader("Access-Control-Allow-Origin") is None  # CORS off by default
    connection.close()


def test_edgespec_generate_stops_at_a_stop_string(server, target_model):
    import subprocess
    import sys
    from pathlib import Path

    prompt = PROMPTS[0]
    from edgespec.edge.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(server.pair.draft_dir)
    full = tokenizer.decode(reference_greedy(target_model, tokenizer.encode(prompt).ids, 24, eos=0))
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    command = [str(Path(sys.executable).parent / "edgespec"), "generate", "--server", server.address,
               "--draft", str(server.pair.draft_dir), "--prompt", prompt, "--max-new-tokens", "24", "--stop", "@@never@@",
               "--stop", stop]
    proc = subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    payload = json.loads(proc.stdout.strip().splitlines()[-1])
    assert payload["text"] == full[: full.index(stop)] and payload["finish_reason"] == "stop"
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout == full[: full.index(stop)] and "[stop]" in proc.stderr


def test_the_device_server_command_serves_cors_and_logs_without_text(server):
    """`edgespec device-server` itself: the new flags reach the server; the access log is on stderr."""
    import http.client
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from helpers import ctrl_c_child, free_port

    port = free_port()
    command = [str(Path(sys.executable).parent / "edgespec"), "device-server", "--server", server.address,
               "--draft", str(server.pair.draft_dir), "--port", str(port), "--cors-origin", "http://localhost:5173",
               "--max-concurrent", "2", "--max-queue", "3", "--queue-timeout", "5"]
    with ctrl_c_child(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            assert "OpenAI-compatible API on" in proc.stdout.readline()  # printed once it listens
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            connection.request("OPTIONS", "/v1/completions", headers={
                "Origin": "http://localhost:5173", "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type"})
            response = connection.getresponse()
            response.read()
            assert response.status == 204 and response.getheader("Access-Control-Allow-Origin") == "http://localhost:5173"
            connection.request("GET", "/health")
            health = json.loads(connection.getresponse().read())
            assert health["generations"] == {"active": 0, "queued": 0, "slots": 2, "queue": 3}
            body = json.dumps({"prompt": PROMPTS[3], "max_tokens": 6, "temperature": 0})
            connection.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
            reply = json.loads(connection.getresponse().read())
            assert reply["usage"]["completion_tokens"] == 6
            connection.close()
        finally:
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=60)
    assert '"POST /v1/completions" 200' in stderr and "completion_tokens=6" in stderr
    assert '"OPTIONS /v1/completions" 204' in stderr and '"GET /health" 200' in stderr
    assert PROMPTS[3].strip() not in stderr  # no prompt text (the scripted test checks the reply's too)


def test_the_device_server_command_refuses_a_bad_setting(server):
    import subprocess
    import sys
    from pathlib import Path

    proc = subprocess.run([str(Path(sys.executable).parent / "edgespec"), "device-server", "--server", server.address,
                           "--draft", str(server.pair.draft_dir), "--max-concurrent", "0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "max_concurrent must be an integer >= 1" in proc.stderr
