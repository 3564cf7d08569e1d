"""The Session over WebSocket (cloud/serving/websocket.py) through a real Serve verifier on the demo
pair: a greedy session gives exactly the gRPC path's tokens; every hostile probe on the route is
closed with its code (4000 + the gRPC status) within the time bound while a healthy gRPC device
runs undisturbed; Info over HTTP; tokens in place of keys; wss:// through the TLS terminator.

The client is the ``websockets`` package's, as a browser would speak it: binary frames, the
``edgespec.v1`` subprotocol, the credential as ``edgespec.auth.<key or token>``.
"""

from __future__ import annotations

import base64
import os
import socket
import ssl
import time

import grpc
import pytest
import yaml
from helpers import PROMPTS, REPO, ModelPair, free_port, start_server, stop_server
from helpers.raw import check_healthy_device, healthy_device
from helpers.tls import make_ca_and_server_cert
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from edgespec.cloud.serving.auth import digest, mint_token
from edgespec.cloud.serving.tls import TlsTerminator
from edgespec.edge.client import EdgeClient
from edgespec.v1 import speculative_pb2 as pb

pytestmark = pytest.mark.slow

DEMO = ModelPair(REPO / "models" / "demo" / "target", REPO / "models" / "demo" / "draft-hf", REPO / "models" / "demo" / "draft")
GOOD, HEALTHY = "es-ws-good-key", "es-ws-healthy-key"
APP = "https://app.example.com"
FIRST_MESSAGE_S, IDLE_S = 2.0, 3.0
FAST_S = 3.0  # a refusal arrives within this (loaded 2-core machine)
NEW_TOKENS = 40


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.yaml"
    keys.write_text(yaml.safe_dump({"keys": [{"id": "good", "sha256": digest(GOOD)}, {"id": "healthy", "sha256": digest(HEALTHY)}]}))
    srv = start_server(DEMO, max_sessions=8, max_context=512, api_keys_file=str(keys), allowed_origins=(APP,),
                       first_message_timeout_s=FIRST_MESSAGE_S, session_idle_timeout_s=IDLE_S)
    yield srv
    stop_server()


@pytest.fixture(scope="module")
def info(server):
    with EdgeClient(server.address, DEMO.draft_dir, api_key=GOOD) as client:
        return client.info()


@pytest.fixture(scope="module")
def healthy(server, info):
    """A device generating over gRPC for the whole module; the last test checks it."""
    yield healthy_device(server, api_key=HEALTHY)


def url(server, path: str = "/v1/session", scheme: str = "ws", port: int | None = None) -> str:
    return f"{scheme}://127.0.0.1:{port or server.http_port}{path}"


def socket_to(server, credential: str | None = GOOD, **options):
    protocols = ["edgespec.v1"] + ([f"edgespec.auth.{credential}"] if credential else [])
    return connect(options.pop("url", None) or url(server), subprotocols=protocols, compression=None, proxy=None,  # type: ignore[arg-type]
                   open_timeout=30, **options)


def send(ws, **kind) -> None:
    ws.send(pb.SessionRequest(**kind).SerializeToString())


def reply(ws, timeout: float = 60) -> pb.SessionResponse:
    return pb.SessionResponse.FromString(ws.recv(timeout=timeout))


def closed_with(ws, timeout: float = FAST_S) -> tuple[int, str]:
    """The close code and reason the server ends the connection with, within ``timeout``."""
    with pytest.raises(ConnectionClosed) as ended:
        while True:
            ws.recv(timeout=timeout)
    assert ended.value.rcvd is not None, "closed without a close frame"
    return ended.value.rcvd.code, ended.value.rcvd.reason


def greedy_over_websocket(ws, info, prompt_ids: list[int], reference: list[int], k: int = 4) -> list[int]:
    """A greedy session driven by hand: drafts are the reference's next tokens, except every third
    round's, which are wrong (so rounds both accept and reject); the output must not depend on it."""
    send(ws, open=pb.Open(prompt_ids=prompt_ids, mode=pb.VERIFY_MODE_GREEDY, tokenizer_fingerprint=info.tokenizer_fingerprint,
                          max_new_tokens=NEW_TOKENS))
    assert reply(ws).HasField("opened")
    out: list[int] = []
    for round_no in range(NEW_TOKENS):
        drafts = (reference[len(out):] + [1] * k)[:k]
        if round_no % 3 == 2:
            drafts = [(token + 1) % info.vocab_size for token in drafts]
        send(ws, draft=pb.Draft(round=round_no, token_ids=drafts))
        verdict = reply(ws).verdict
        out += drafts[:verdict.accepted] + [verdict.next_token]
        if verdict.finished:
            break
    send(ws, close=pb.Close())
    assert reply(ws).HasField("closed")
    assert closed_with(ws)[0] == 1000
    return out


def test_greedy_over_websocket_equals_the_grpc_path(server, info, healthy):
    with EdgeClient(server.address, DEMO.draft_dir, api_key=GOOD) as client:
        for prompt in PROMPTS[:3]:
            ids = client.encode(prompt)
            expected = client.generate(ids, max_new_tokens=NEW_TOKENS, k=4, stop_token_ids=()).token_ids
            with socket_to(server) as ws:
                assert ws.subprotocol == "edgespec.v1"
                assert greedy_over_websocket(ws, info, ids, expected) == expected


def test_cloud_only_over_websocket_equals_the_grpc_path(server, info):
    with EdgeClient(server.address, DEMO.draft_dir, api_key=GOOD) as client:
        ids = client.encode(PROMPTS[5])
        expected = client.generate_cloud(ids, max_new_tokens=NEW_TOKENS, stop_token_ids=()).token_ids
    with socket_to(server, url=url(server, "/v1/generate")) as ws:
        ws.send(pb.GenerateRequest(prompt_ids=ids, max_new_tokens=NEW_TOKENS).SerializeToString())
        got: list[int] = []
        while not (message := pb.GenerateResponse.FromString(ws.recv(timeout=60))).finished:
            got += message.token_ids
        got += message.token_ids
        assert closed_with(ws)[0] == 1000
    assert got == expected


def test_a_token_stands_for_its_key_on_both_transports(server, info):
    token = mint_token("good", digest(GOOD), 60)
    with EdgeClient(server.address, DEMO.draft_dir, api_key=token) as client:
        ids = client.encode(PROMPTS[3])
        expected = client.generate(ids, max_new_tokens=NEW_TOKENS, k=3, stop_token_ids=()).token_ids
    with socket_to(server, token) as ws:
        assert greedy_over_websocket(ws, info, ids, expected) == expected
    bound = mint_token("good", digest(GOOD), 60, origin=APP)
    with socket_to(server, bound, origin=APP) as ws:  # type: ignore[arg-type]
        send(ws, open=pb.Open(prompt_ids=ids, mode=pb.VERIFY_MODE_GREEDY, tokenizer_fingerprint=info.tokenizer_fingerprint))
        assert reply(ws).HasField("opened")


def test_the_bearer_header_authenticates_too(server, info):
    with socket_to(server, None, additional_headers={"authorization": f"Bearer {GOOD}"}) as ws:
        send(ws, open=pb.Open(prompt_ids=[5, 6, 7], mode=pb.VERIFY_MODE_GREEDY, tokenizer_fingerprint=info.tokenizer_fingerprint))
        assert reply(ws).HasField("opened")


# ---- hostile probes: each closed with its code within the bound ----------------------------------


def expect_close(ws, code: grpc.StatusCode, fragment: str, timeout: float = FAST_S) -> None:
    got, reason = closed_with(ws, timeout)
    assert (got, fragment in reason) == (4000 + code.value[0], True), (got, reason)
    assert len(reason.encode()) <= 123


@pytest.mark.parametrize("credential, code, fragment", [
    (None, grpc.StatusCode.UNAUTHENTICATED, "no API key"),
    ("es-not-a-key", grpc.StatusCode.UNAUTHENTICATED, "unknown or revoked"),
    ("tampered", grpc.StatusCode.UNAUTHENTICATED, "signature does not match"),
    ("expired", grpc.StatusCode.UNAUTHENTICATED, "expired"),
    ("other-origin", grpc.StatusCode.PERMISSION_DENIED, "for pages of"),
])
def test_a_bad_credential_is_closed_before_any_work(server, info, healthy, credential, code, fragment):
    if credential == "tampered":
        head, payload, _ = mint_token("good", digest(GOOD), 60).split(".")
        credential = f"{head}.{payload}.{base64.urlsafe_b64encode(b'x' * 32).rstrip(b'=').decode()}"
    elif credential == "expired":
        credential = mint_token("good", digest(GOOD), 60, now=time.time() - 120)
    elif credential == "other-origin":
        credential = mint_token("good", digest(GOOD), 60, origin="https://other.example.com")
    with socket_to(server, credential, origin=APP) as ws:  # type: ignore[arg-type]
        expect_close(ws, code, fragment)  # at once: the credential is checked before any message is read


def test_a_foreign_origin_is_closed(server, healthy):
    with socket_to(server, origin="https://evil.example.com") as ws:  # type: ignore[arg-type]
        expect_close(ws, grpc.StatusCode.PERMISSION_DENIED, "not allowed")


def test_no_open_within_the_deadline(server, healthy):
    with socket_to(server) as ws:
        expect_close(ws, grpc.StatusCode.DEADLINE_EXCEEDED, "no Open within", timeout=FIRST_MESSAGE_S + FAST_S)


def test_no_generate_request_within_the_deadline(server, healthy):
    with socket_to(server, url=url(server, "/v1/generate")) as ws:
        expect_close(ws, grpc.StatusCode.DEADLINE_EXCEEDED, "no GenerateRequest within", timeout=FIRST_MESSAGE_S + FAST_S)


def test_an_idle_session_is_closed(server, info, healthy):
    with socket_to(server) as ws:
        send(ws, open=pb.Open(prompt_ids=[5, 6, 7], mode=pb.VERIFY_MODE_GREEDY, tokenizer_fingerprint=info.tokenizer_fingerprint))
        assert reply(ws).HasField("opened")
        expect_close(ws, grpc.StatusCode.DEADLINE_EXCEEDED, "idle", timeout=IDLE_S + FAST_S)


def test_a_frame_over_the_message_cap(server, info, healthy):
    with socket_to(server) as ws:
        ws.send(b"\x0a" + b"\xff" * (info.max_message_bytes + 1))
        expect_close(ws, grpc.StatusCode.RESOURCE_EXHAUSTED, "limit of")


@pytest.mark.parametrize("frame, fragment", [
    (b"\xff\xff\xff\xff garbage", "not a valid edgespec.v1.SessionRequest"),
    ("{\"open\": {}}", "text frame"),
])
def test_garbage_and_text_frames(server, healthy, frame, fragment):
    with socket_to(server) as ws:
        ws.send(frame)
        expect_close(ws, grpc.StatusCode.INVALID_ARGUMENT, fragment)


def test_a_slow_client_dripping_its_open_is_closed_at_the_deadline(server, info, healthy):
    """A client that sends its first frame a byte at a time never completes a message: the same
    first-message deadline ends it (the HTTP server holds the partial frame, not the session)."""
    key = base64.b64encode(os.urandom(16)).decode()
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as raw:
        raw.sendall((f"GET /v1/session HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                     f"Sec-WebSocket-Protocol: edgespec.v1, edgespec.auth.{GOOD}\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += raw.recv(4096)
        assert head.startswith(b"HTTP/1.1 101"), head
        body = pb.SessionRequest(open=pb.Open(prompt_ids=[5, 6, 7], mode=pb.VERIFY_MODE_GREEDY,
                                              tokenizer_fingerprint=info.tokenizer_fingerprint)).SerializeToString()
        frame = bytes([0x82, 0x80 | len(body)]) + b"\0\0\0\0" + body  # masked with zeros: the payload as is
        closed_at = time.monotonic() + FIRST_MESSAGE_S + FAST_S
        received = head.split(b"\r\n\r\n", 1)[1]
        raw.settimeout(0.4)
        for byte in frame[:-1]:
            raw.sendall(bytes([byte]))
            try:
                received += raw.recv(4096)
            except socket.timeout:
                pass
            if received or time.monotonic() > closed_at:
                break
        raw.settimeout(FAST_S)
        while len(received) < 4:
            received += raw.recv(4096)
    assert received[0] == 0x88, received  # a close frame
    code = int.from_bytes(received[2:4], "big")
    assert code == 4000 + grpc.StatusCode.DEADLINE_EXCEEDED.value[0], received


# ---- Info over HTTP, wss:// ------------------------------------------------------------------------


def http_get(server, path: str, headers: dict[str, str]):
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url(server, path, "http"), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def test_info_over_http_is_the_grpc_info(server, info):
    status, headers, body = http_get(server, "/v1/info", {"authorization": f"Bearer {GOOD}", "origin": APP})
    assert status == 200 and headers["content-type"] == "application/x-protobuf"
    assert headers["access-control-allow-origin"] == APP
    got = pb.InfoResponse.FromString(body)
    assert (got.tokenizer_fingerprint, got.vocab_size, got.max_message_bytes) == (info.tokenizer_fingerprint, info.vocab_size,
                                                                                 info.max_message_bytes)
    assert http_get(server, "/v1/info", {"origin": "https://evil.example.com"})[0] == 403
    status, headers, body = http_get(server, "/v1/info", {"authorization": "Bearer es-wrong"})
    assert (status, headers.get("grpc-status")) == (401, "16") and b"unknown or revoked" in body


def test_wss_through_the_tls_terminator(server, info, tmp_path):
    certs = make_ca_and_server_cert(tmp_path)
    with TlsTerminator(certs["cert"], certs["key"], upstream=server.address, listen_port=free_port(), listen_host="127.0.0.1",
                       http_upstream=f"127.0.0.1:{server.http_port}", http_listen_port=free_port()) as terminator:
        context = ssl.create_default_context(cafile=str(certs["ca"]))
        port = int(terminator.http_address.rsplit(":", 1)[1])
        with EdgeClient(server.address, DEMO.draft_dir, api_key=GOOD) as client:
            ids = client.encode(PROMPTS[4])
            expected = client.generate(ids, max_new_tokens=NEW_TOKENS, k=4, stop_token_ids=()).token_ids
        with socket_to(server, url=url(server, scheme="wss", port=port), ssl=context) as ws:
            assert greedy_over_websocket(ws, info, ids, expected) == expected


def test_the_healthy_device_was_never_disturbed(server, healthy):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(DEMO.target_dir)).eval()
    check_healthy_device(healthy, model, min_results=3)
