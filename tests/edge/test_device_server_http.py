"""The device server's HTTP behaviour on a scripted client (no model, no verifier): /health,
CORS preflights, the bounded queue (429, 503 with Retry-After), concurrent generations, chat
fields (no max_tokens, max_completion_tokens, array content, top_k), stop strings, streamed
usage and the access log. Generations block on events, so nothing depends on timing."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
import time
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from edgespec.edge.openai_server import ACCESS_LOG, DeviceServer, DeviceServerConfig
from edgespec.edge.request_gate import Busy, RequestGate

TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
MAX_CONTEXT, VERIFIER_MAX_NEW = 256, 100
SECRET = "my secret prompt"


class ScriptedStream:
    """What EdgeClient.stream returns: text pieces, then .result; waits on ``go`` before the first."""

    def __init__(self, client, prompt_ids, params):
        self.client, self.params, self.result, self.token_ids = client, params, None, []
        self.pieces = list(client.reply)[: params["max_new_tokens"]]
        self.closed = False

    def __iter__(self):
        self.client.started.release()
        assert self.client.go.wait(30), "the test never let the generation go"
        for i, piece in enumerate(self.pieces):
            if self.closed:
                return
            if i == 1:
                assert self.client.more.wait(30), "the test never let the generation go on"
            self.token_ids.append(len(self.token_ids))
            yield piece
        self.result = SimpleNamespace(finish_reason="length")

    def close(self):
        self.closed = True


class ScriptedClient:
    """The EdgeClient methods the device server uses; one character a token."""

    def __init__(self, reply="hello world, again"):
        self.reply, self.calls, self.streams = reply, [], []
        self.go, self.more = threading.Event(), threading.Event()  # before the first piece, after it
        self.go.set()
        self.more.set()
        self.started = threading.Semaphore(0)  # released once per generation that began

    def info(self):
        return SimpleNamespace(model_id="scripted", max_context=MAX_CONTEXT, max_new_tokens=VERIFIER_MAX_NEW)

    def encode(self, prompt):
        return [ord(c) for c in prompt] if isinstance(prompt, str) else list(prompt)

    def stream(self, prompt_ids, **params):
        self.calls.append({"prompt_ids": prompt_ids, **params})
        if params.get("top_k") == 13:
            raise ValueError("top_k 13 is unlucky")  # as GenerationParams refuses what it cannot serve
        self.streams.append(ScriptedStream(self, prompt_ids, params))
        return self.streams[-1]


@contextmanager
def running(tmp_path, reply="hello world, again", **config):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    client = ScriptedClient(reply)
    device = DeviceServer(("127.0.0.1", 0), client, tmp_path, config=DeviceServerConfig(**config))
    thread = threading.Thread(target=device.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield device, client
    finally:
        client.go.set()
        client.more.set()
        device.shutdown()
        device.server_close()


def call(device, method, path, body=None, headers=None):
    connection = http.client.HTTPConnection(*device.server_address[:2], timeout=30)
    data = json.dumps(body).encode() if body is not None else None
    connection.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
    response = connection.getresponse()
    raw = response.read()
    connection.close()
    return response.status, dict(response.getheaders()), raw


def post(device, path, body, headers=None):
    status, headers, raw = call(device, "POST", path, body, headers)
    return status, headers, (json.loads(raw) if raw and not raw.startswith(b"data:") else raw)


def chat(content="hi", **fields):
    return {"messages": [{"role": "user", "content": content}], "temperature": 0, **fields}


def until(condition, what):
    """Waits for a state the test itself brings about (never asserts on elapsed time)."""
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.005)


# ---- /health, CORS ---------------------------------------------------------------------------


def test_health_answers_with_the_generations_running_and_queued(tmp_path):
    with running(tmp_path, max_concurrent=2, max_queue=3) as (device, _):
        status, _, raw = call(device, "GET", "/health")
        assert status == 200
        assert json.loads(raw) == {"status": "ok", "model": "scripted",
                                   "generations": {"active": 0, "queued": 0, "slots": 2, "queue": 3}}


PREFLIGHT = {"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"}


def test_a_preflight_from_an_allowed_origin_is_answered(tmp_path):
    with running(tmp_path, cors_origins=("http://localhost:3000/", "app://electron")) as (device, _):
        status, headers, _ = call(device, "OPTIONS", "/v1/chat/completions", headers=PREFLIGHT)
        assert status == 204
        assert headers["Access-Control-Allow-Origin"] == "http://localhost:3000" and headers["Vary"] == "Origin"
        assert "POST" in headers["Access-Control-Allow-Methods"]
        assert headers["Access-Control-Allow-Headers"] == PREFLIGHT["Access-Control-Request-Headers"]
        # and the request itself carries the header the browser checks
        status, headers, reply = post(device, "/v1/chat/completions", chat(max_tokens=5), {"Origin": "app://electron"})
        assert status == 200 and headers["Access-Control-Allow-Origin"] == "app://electron"


def test_a_preflight_from_another_origin_is_refused(tmp_path):
    with running(tmp_path, cors_origins=("http://localhost:3000",)) as (device, _):
        evil = {**PREFLIGHT, "Origin": "https://evil.example"}
        status, headers, raw = call(device, "OPTIONS", "/v1/chat/completions", headers=evil)
        assert status == 403 and "Access-Control-Allow-Origin" not in headers
        assert b"--cors-origin https://evil.example" in raw
        status, headers, _ = post(device, "/v1/chat/completions", chat(max_tokens=5), {"Origin": "https://evil.example"})
        assert "Access-Control-Allow-Origin" not in headers  # served, but no browser may read it


def test_cors_is_off_by_default_and_star_allows_any_origin(tmp_path):
    with running(tmp_path) as (device, _):
        status, headers, _ = call(device, "OPTIONS", "/v1/completions", headers=PREFLIGHT)
        assert status == 403 and "Access-Control-Allow-Origin" not in headers
        status, headers, _ = call(device, "OPTIONS", "/v1/completions")  # not a preflight
        assert status == 204 and "POST" in headers["Allow"]
    with running(tmp_path, cors_origins=("*",)) as (device, _):
        status, headers, _ = call(device, "OPTIONS", "/v1/completions", headers=PREFLIGHT)
        assert status == 204 and headers["Access-Control-Allow-Origin"] == "*"
        status, headers, _ = call(device, "GET", "/health", headers={"Origin": "https://any.example"})
        assert headers["Access-Control-Allow-Origin"] == "*" and "Retry-After" in headers["Access-Control-Expose-Headers"]


# ---- admission: concurrent, queued, refused --------------------------------------------------


def background_post(device, body, replies):
    thread = threading.Thread(target=lambda: replies.append(post(device, "/v1/completions", body)), daemon=True)
    thread.start()
    return thread


def test_generations_run_at_once_and_a_full_queue_answers_429(tmp_path):
    with running(tmp_path, max_concurrent=2, max_queue=1, queue_timeout_s=60) as (device, client):
        client.go.clear()  # generations start, then wait for the test
        replies: list = []
        body = {"prompt": "x", "max_tokens": 5, "temperature": 0}
        threads = [background_post(device, body, replies) for _ in range(2)]
        for _ in range(2):
            assert client.started.acquire(timeout=30)  # both generations began: two at once
        assert device.gate.active == 2
        threads.append(background_post(device, body, replies))
        until(lambda: device.gate.queued == 1, "the third request queued")
        status, headers, error = post(device, "/v1/completions", body)
        assert status == 429 and headers["Retry-After"] == "1" and error["error"]["type"] == "rate_limit_error"
        client.go.set()
        for thread in threads:
            thread.join(30)
        assert [status for status, _, _ in replies] == [200, 200, 200]  # the queued one was served too
        assert all(reply["choices"][0]["text"] == "hello" for _, _, reply in replies)
        until(lambda: device.gate.active == 0, "every slot given back")  # just after each reply's last byte


def test_a_request_waits_a_bounded_time_then_503(tmp_path):
    with running(tmp_path, max_concurrent=1, max_queue=4, queue_timeout_s=0) as (device, _):
        device.gate.acquire()  # the one slot, held by the test
        status, headers, error = post(device, "/v1/completions", {"prompt": "x", "max_tokens": 3})
        assert status == 503 and headers["Retry-After"] == "1" and "no generation slot" in error["error"]["message"]
        device.gate.release()
        assert post(device, "/v1/completions", {"prompt": "x", "max_tokens": 3})[0] == 200


def test_the_gate_hands_a_freed_slot_to_the_longest_waiter():
    gate = RequestGate(slots=1, queue=2, wait_s=60)
    gate.acquire()
    order: list = []
    first = threading.Thread(target=lambda: (gate.acquire(), order.append("first")))
    first.start()
    until(lambda: gate.queued == 1, "first queued")
    second = threading.Thread(target=lambda: (gate.acquire(), order.append("second")))
    second.start()
    until(lambda: gate.queued == 2, "second queued")
    with pytest.raises(Busy) as caught:
        gate.acquire()
    assert caught.value.status == 429
    gate.release()
    first.join(30)
    assert order == ["first"] and gate.active == 1 and gate.queued == 1
    gate.release()
    second.join(30)
    assert order == ["first", "second"]
    gate.release()
    assert gate.snapshot() == {"active": 0, "queued": 0, "slots": 1, "queue": 2}


@pytest.mark.parametrize("options", [dict(slots=0, queue=1, wait_s=1), dict(slots=1, queue=-1, wait_s=1),
                                     dict(slots=1, queue=1, wait_s=float("nan"))])
def test_gate_settings_are_checked(options):
    with pytest.raises(ValueError):
        RequestGate(**options)


@pytest.mark.parametrize("fields, name", [({"max_concurrent": 0}, "max_concurrent"), ({"max_queue": -1}, "max_queue"),
                                          ({"queue_timeout_s": -1}, "queue_timeout_s"), ({"cors_origins": ("a b",)}, "cors_origins")])
def test_server_settings_name_the_field(fields, name):
    with pytest.raises(ValueError, match=name):
        DeviceServerConfig(**fields)


# ---- the new fields ------------------------------------------------------------------------


def test_chat_without_max_tokens_runs_to_the_contexts_end(tmp_path):
    with running(tmp_path) as (device, client):
        assert post(device, "/v1/chat/completions", chat("hi"))[0] == 200
        prompt = len("<user>hi\n<assistant>")
        assert client.calls[-1]["max_new_tokens"] == min(MAX_CONTEXT - prompt, VERIFIER_MAX_NEW)
        post(device, "/v1/chat/completions", chat("x" * 200))
        assert client.calls[-1]["max_new_tokens"] == MAX_CONTEXT - 200 - len("<user>\n<assistant>")
        post(device, "/v1/chat/completions", chat("hi", max_completion_tokens=7, max_tokens=9))
        assert client.calls[-1]["max_new_tokens"] == 7  # max_completion_tokens wins
        post(device, "/v1/completions", {"prompt": "hi"})
        assert client.calls[-1]["max_new_tokens"] == 16  # completions keep OpenAI's default
        status, _, error = post(device, "/v1/chat/completions", chat("hi", max_tokens=VERIFIER_MAX_NEW + 1))
        assert status == 400 and error["error"]["param"] == "max_tokens"
        status, _, error = post(device, "/v1/chat/completions", chat("x" * MAX_CONTEXT))
        assert status == 400 and "context holds 256" in error["error"]["message"]


def test_top_k_is_applied_when_sampling(tmp_path):
    with running(tmp_path) as (device, client):
        post(device, "/v1/chat/completions", chat(temperature=0.8, top_k=20, max_tokens=4))
        assert client.calls[-1]["top_k"] == 20 and "mode" not in client.calls[-1]  # the SDK default: coupled
        post(device, "/v1/chat/completions", chat(temperature=0, top_k=20, max_tokens=4))
        assert "top_k" not in client.calls[-1]  # greedy: the argmax is in every top k
        status, _, error = post(device, "/v1/chat/completions", chat(temperature=0.8, top_k=-2))
        assert status == 400 and error["error"]["param"] == "top_k"


def test_content_as_an_array_of_text_parts(tmp_path):
    with running(tmp_path) as (device, client):
        parts = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
        assert post(device, "/v1/chat/completions", chat(parts, max_tokens=3))[0] == 200
        assert client.calls[-1]["prompt_ids"] == client.encode("<user>one\ntwo\n<assistant>")
        image = [{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "data:,"}}]
        status, _, error = post(device, "/v1/chat/completions", chat(image, max_tokens=3))
        assert status == 400 and "messages[0].content[1] is a 'image_url' part" in error["error"]["message"]
        status, _, error = post(device, "/v1/chat/completions", chat([{"text": "untyped"}], max_tokens=3))
        assert status == 400 and "untyped part" in error["error"]["message"]


@pytest.mark.parametrize("field, value", [("tools", [{"type": "function", "function": {"name": "f"}}]),
                                          ("response_format", {"type": "json_object"}), ("logprobs", True),
                                          ("frequency_penalty", 0.5), ("logit_bias", {"1": 5})])
def test_fields_that_would_change_the_output_are_refused_by_name(tmp_path, field, value):
    with running(tmp_path) as (device, _):
        status, _, error = post(device, "/v1/chat/completions", chat(max_tokens=3, **{field: value}))
        assert status == 400 and error["error"]["param"] == field


def test_stop_strings_end_the_reply(tmp_path):
    with running(tmp_path, reply="hello world, again") as (device, _):
        status, _, reply = post(device, "/v1/chat/completions", chat(max_tokens=50, stop=["xyz", "wor"]))
        assert reply["choices"][0]["message"]["content"] == "hello " and reply["choices"][0]["finish_reason"] == "stop"


def sse_events(raw: bytes) -> list:
    lines = [line[len(b"data: "):] for line in raw.split(b"\n\n") if line.startswith(b"data: ")]
    assert lines[-1] == b"[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_streamed_usage_comes_last_with_include_usage(tmp_path):
    with running(tmp_path, reply="abcdef") as (device, _):
        body = chat(max_tokens=4, stream=True, stream_options={"include_usage": True})
        events = sse_events(call(device, "POST", "/v1/chat/completions", body)[2])
        assert events[-1]["choices"] == [] and events[-1]["usage"] == {
            "prompt_tokens": len("<user>hi\n<assistant>"), "completion_tokens": 4, "total_tokens": len("<user>hi\n<assistant>") + 4}
        assert all(event["usage"] is None for event in events[:-1])
        assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1]) == "abcd"
        plain = sse_events(call(device, "POST", "/v1/completions", {"prompt": "p", "max_tokens": 2, "stream": True})[2])
        assert all("usage" not in event for event in plain) and "".join(e["choices"][0]["text"] for e in plain) == "ab"
        status, _, error = post(device, "/v1/completions", {"prompt": "p", "stream_options": {"include_usage": True}})
        assert status == 400 and error["error"]["param"] == "stream_options"


def test_the_access_log_has_no_prompt_or_reply_text(tmp_path, caplog):
    with running(tmp_path, reply="the reply text") as (device, _), caplog.at_level(logging.INFO, logger=ACCESS_LOG.name):
        post(device, "/v1/chat/completions", chat(SECRET, max_tokens=9))
        call(device, "GET", "/nowhere")
        logged = lambda: [record.getMessage() for record in caplog.records if record.name == ACCESS_LOG.name]  # noqa: E731
        until(lambda: len(logged()) == 2, "two access-log lines")  # each is written once its reply is sent
    lines = sorted(logged(), key=lambda line: "POST" not in line)  # written as each reply ends: in either order
    prompt = len(f"<user>{SECRET}\n<assistant>")
    assert '"POST /v1/chat/completions" 200' in lines[0] and f"prompt_tokens={prompt} completion_tokens=9" in lines[0]
    assert lines[0].endswith(" ms") and '"GET /nowhere" 404' in lines[1]
    assert not any(SECRET in line or "reply" in line for line in lines)


def test_a_refusal_from_the_sdk_is_a_400_even_when_streaming(tmp_path):
    with running(tmp_path) as (device, _):
        status, headers, raw = call(device, "POST", "/v1/chat/completions", chat(temperature=0.5, top_k=13, stream=True))
        assert status == 400 and b"unlucky" in raw and headers["Content-Type"] == "application/json"
        until(lambda: device.gate.active == 0, "the slot given back")


def test_a_refusal_before_the_body_is_read_closes_the_connection(tmp_path):
    with running(tmp_path) as (device, _):
        connection = http.client.HTTPConnection(*device.server_address[:2], timeout=30)
        connection.request("POST", "/v1/nowhere", body=b'{"prompt": "GET /health HTTP/1.1"}')
        response = connection.getresponse()
        response.read()
        assert response.status == 404 and response.getheader("Connection") == "close"
        connection.close()


def test_an_app_that_goes_away_mid_stream_ends_its_generation_and_frees_its_slot(tmp_path):
    with running(tmp_path, reply="x" * VERIFIER_MAX_NEW, max_concurrent=1) as (device, client):
        client.more.clear()
        body = json.dumps({"prompt": "p", "max_tokens": VERIFIER_MAX_NEW, "stream": True}).encode()
        with socket.create_connection(device.server_address[:2], timeout=30) as app:
            app.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            received = b""
            while b"data: " not in received:  # the first piece arrived
                received += app.recv(4096)
        # the app went away; the generation goes on, and its next writes fail
        client.more.set()
        until(lambda: device.gate.active == 0, "the slot given back")
        assert len(client.streams[-1].token_ids) < VERIFIER_MAX_NEW  # ended early, not run to its end
        assert post(device, "/v1/completions", {"prompt": "p", "max_tokens": 2})[0] == 200
