"""A hostile client against a verifier that requires API keys: every attack gets its precise
status within a time bound, the replica's memory stays bounded, and a healthy session running
throughout (with its own key) produces exactly the target's greedy output.

The cases that need no key are in test_bad_input.py (validation of every message field); here:
keys and quotas, silent and slow streams, admission, oversize and garbage bytes, bad numbers,
send-ahead and tree abuse, cancelled prefills.
"""

from __future__ import annotations

import os
import time

import grpc
import pytest
import yaml
from helpers import reference_greedy, start_server, stop_server
from helpers.raw import Session as RawSession
from helpers.raw import check_healthy_device, healthy_device, open_msg

from edgespec.cloud.serving.auth import digest
from edgespec.edge.client import EdgeClient
from edgespec.edge.errors import AuthenticationError
from edgespec.v1 import speculative_pb2 as pb
from edgespec.v1 import speculative_pb2_grpc as pb_grpc

pytestmark = pytest.mark.slow

GOOD, TIGHT, HEALTHY = "es-good-key", "es-tight-key", "es-healthy-key"
FIRST_MESSAGE_S, IDLE_S = 2.0, 3.0
MAX_SESSIONS = 8
MESSAGE_CAP = 1 << 20  # the transport's limit for this module's Ray instance
FAST_S = 3.0  # a refusal arrives within this (loaded 2-core machine)
KV_BUDGET = 1 << 20  # the tiny target's KV is 1 KiB a token: four full-context sessions


def key_entries(extra: list[dict] | None = None) -> dict:
    return {"keys": [
        {"id": "good", "sha256": digest(GOOD)},
        {"id": "tight", "sha256": digest(TIGHT), "max_sessions": 1, "tokens_per_minute": 60},
        {"id": "healthy", "sha256": digest(HEALTHY)},
        *(extra or []),
    ]}


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("keys") / "keys.yaml"
    path.write_text(yaml.safe_dump(key_entries()))
    return path


@pytest.fixture(scope="module")
def server(tiny_pair, keys_file):
    saved = os.environ.get("RAY_SERVE_GRPC_MAX_MESSAGE_SIZE")
    os.environ["RAY_SERVE_GRPC_MAX_MESSAGE_SIZE"] = str(MESSAGE_CAP)  # read by the Ray processes it starts
    try:
        srv = start_server(tiny_pair, max_sessions=MAX_SESSIONS, max_new_tokens=256, max_context=256, max_k=8,
                           api_keys_file=str(keys_file), first_message_timeout_s=FIRST_MESSAGE_S,
                           session_idle_timeout_s=IDLE_S, max_kv_bytes=KV_BUDGET, max_q_entries=64)
    finally:
        if saved is None:
            os.environ.pop("RAY_SERVE_GRPC_MAX_MESSAGE_SIZE", None)
        else:
            os.environ["RAY_SERVE_GRPC_MAX_MESSAGE_SIZE"] = saved
    yield srv
    stop_server()


@pytest.fixture(scope="module")
def channel(server):
    with grpc.insecure_channel(server.address) as channel:
        yield channel


@pytest.fixture(scope="module")
def stub(channel):
    return pb_grpc.SpeculativeStub(channel)


def md(key: str | None = GOOD, header: str = "authorization") -> tuple:
    if key is None:
        return ()
    return ((header, f"Bearer {key}" if header == "authorization" else key),)


@pytest.fixture(scope="module")
def info(stub):
    return stub.Info(pb.InfoRequest(), metadata=md(), timeout=30)


@pytest.fixture(scope="module")
def healthy(server, target_model):
    """A well-behaved device with its own key, generating the whole time."""
    yield healthy_device(server, api_key=HEALTHY)


def Session(stub, key: str | None = GOOD, header: str = "authorization") -> RawSession:  # noqa: N802
    """A raw bidi stream presenting ``key``."""
    return RawSession(stub, md(key, header))


def refused(call, code: grpc.StatusCode, *fragments: str, within: float = FAST_S) -> str:
    """Runs ``call`` (raising grpc.RpcError), checks the code, the message and the time it took."""
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as caught:
        call()
    elapsed = time.monotonic() - started
    assert caught.value.code() == code, (caught.value.code(), caught.value.details())
    for fragment in fragments:
        assert fragment in caught.value.details(), caught.value.details()
    assert elapsed < within, f"refused after {elapsed:.1f}s"
    return caught.value.details()


def session_refused(stub, info, code, *fragments, key=GOOD, within=FAST_S, header="authorization", **open_fields):
    # The Open is built before the stream opens: the server's first-message deadline
    # (FIRST_MESSAGE_S) runs from then, and building a 10-million-token Open on a loaded machine
    # can take longer than that.
    message = open_msg(info, **open_fields)
    session = Session(stub, key, header)
    session.send(open=message)
    try:
        return refused(session.reply, code, *fragments, within=within)
    finally:
        session.close()


def opened(stub, info, key=GOOD, **open_fields) -> Session:
    session = Session(stub, key)
    session.send(open=open_msg(info, **open_fields))
    assert session.reply().HasField("opened")
    return session


def rss(stub) -> int:
    return stub.Info(pb.InfoRequest(), metadata=md(), timeout=30).replica_rss_bytes


# ---- keys ----------------------------------------------------------------------------------

KEY_CASES = {"no key": (None, "authorization"), "unknown key": ("es-nobody", "authorization"),
             "empty bearer": ("", "authorization"), "unknown x-api-key": ("es-nobody", "x-api-key")}


@pytest.mark.parametrize("case", list(KEY_CASES))
def test_session_without_a_valid_key(stub, info, healthy, case):
    key, header = KEY_CASES[case]
    session_refused(stub, info, grpc.StatusCode.UNAUTHENTICATED, "API key", key=key or None, header=header)


@pytest.mark.parametrize("case", list(KEY_CASES))
def test_generate_without_a_valid_key(stub, healthy, case):
    key, header = KEY_CASES[case]
    refused(lambda: list(stub.Generate(pb.GenerateRequest(prompt_ids=[5]), metadata=md(key or None, header), timeout=30)),
            grpc.StatusCode.UNAUTHENTICATED, "API key")


def test_a_wrong_key_on_info_is_refused(stub, healthy):
    refused(lambda: stub.Info(pb.InfoRequest(), metadata=md("es-nobody"), timeout=30), grpc.StatusCode.UNAUTHENTICATED)


def test_info_without_a_key_tells_no_replica_diagnostics(stub, healthy):
    public = stub.Info(pb.InfoRequest(), timeout=30)
    keyed = stub.Info(pb.InfoRequest(), metadata=md(), timeout=30)
    assert public.tokenizer_fingerprint == keyed.tokenizer_fingerprint and public.max_k == keyed.max_k
    assert public.replica_rss_bytes == 0 and public.target_params == 0 and public.active_sessions == 0
    assert public.free_sessions == 0 and keyed.free_sessions > 0  # the load is the operator's to know
    assert keyed.replica_rss_bytes > 0 and keyed.target_params > 0
    # The limits every client needs, with or without a key.
    for reply in (public, keyed):
        assert (reply.max_sessions, reply.first_message_timeout_s, reply.session_idle_timeout_s) == (
            MAX_SESSIONS, FIRST_MESSAGE_S, IDLE_S)
        assert reply.auth_required and reply.max_q_entries == 64 and reply.default_max_new_tokens > 0
        assert 0 < reply.max_message_bytes <= MESSAGE_CAP


def test_the_key_may_come_as_x_api_key(stub, info, healthy):
    session = Session(stub, GOOD, "x-api-key")
    session.send(open=open_msg(info))
    assert session.reply().HasField("opened")
    session.close()


@pytest.mark.parametrize("service", ["grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"])
def test_reflection_needs_a_key_and_answers_with_one(channel, healthy, service):
    from grpc_reflection.v1alpha import reflection_pb2

    call = channel.stream_stream(f"/{service}/ServerReflectionInfo",
                                 request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
                                 response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)
    ask = [reflection_pb2.ServerReflectionRequest(list_services="")]
    refused(lambda: list(call(iter(ask), timeout=30)), grpc.StatusCode.UNAUTHENTICATED)
    names = {s.name for s in list(call(iter(ask), metadata=md(), timeout=30))[0].list_services_response.service}
    assert {"edgespec.v1.Speculative", "grpc.health.v1.Health", service} <= names
    files = list(call(iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol="edgespec.v1.Speculative")]),
                      metadata=md(), timeout=30))
    assert files[0].file_descriptor_response.file_descriptor_proto


def test_a_silent_reflection_stream_is_closed_within_the_first_message_deadline(channel, healthy):
    import queue

    from grpc_reflection.v1alpha import reflection_pb2

    call = channel.stream_stream("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                                 request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
                                 response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)
    never: queue.Queue = queue.Queue()
    replies = call(iter(never.get, None), metadata=md(), timeout=30)
    try:
        refused(lambda: next(replies), grpc.StatusCode.DEADLINE_EXCEEDED, "no request within", within=FIRST_MESSAGE_S + FAST_S)
    finally:
        never.put(None)
        replies.cancel()


def test_health_needs_no_key(channel, healthy):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    health = health_pb2_grpc.HealthStub(channel)
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=30).status == health_pb2.HealthCheckResponse.SERVING


def test_keys_are_added_and_revoked_without_a_restart(stub, info, keys_file, healthy):
    fresh = "es-fresh-key"
    session_refused(stub, info, grpc.StatusCode.UNAUTHENTICATED, key=fresh)
    keys_file.write_text(yaml.safe_dump(key_entries([{"id": "fresh", "sha256": digest(fresh)}])))
    time.sleep(1.5)  # the file is looked at once a second
    opened(stub, info, key=fresh).close()
    keys_file.write_text(yaml.safe_dump(key_entries()))
    time.sleep(1.5)
    session_refused(stub, info, grpc.StatusCode.UNAUTHENTICATED, key=fresh)


def test_a_broken_keys_file_keeps_the_keys_loaded_before(stub, info, keys_file, healthy):
    keys_file.write_text("keys: [ {id: broken")
    time.sleep(1.5)
    try:
        opened(stub, info).close()
    finally:
        keys_file.write_text(yaml.safe_dump(key_entries()))
        time.sleep(1.5)


def test_the_sdk_raises_a_typed_error_and_does_not_retry_a_bad_key(server):
    with EdgeClient(server.address, server.pair.draft_dir, api_key="es-nobody", max_retries=5) as client:
        started = time.monotonic()
        with pytest.raises(AuthenticationError):
            client.generate("x = ", max_new_tokens=4)
        assert time.monotonic() - started < FAST_S


# ---- quotas --------------------------------------------------------------------------------


def test_a_key_over_its_session_quota(stub, info, healthy):
    first = opened(stub, info, key=TIGHT)
    try:
        details = session_refused(stub, info, grpc.StatusCode.RESOURCE_EXHAUSTED, "'tight'", "retry after", key=TIGHT)
        assert "es-tight" not in details  # the id, never the key
    finally:
        first.close()
    time.sleep(0.5)
    opened(stub, info, key=TIGHT).close()  # the slot came back


def test_a_key_over_its_tokens_per_minute(stub, info, healthy):
    # The key's one session slot comes back once the replica has seen the last test's cancel,
    # which travels through the proxy: until then an Open is refused for the open session, and
    # rightly. Those refusals are waited out (bounded); the one asserted on is the token quota's.
    refusal, slot_deadline = None, time.monotonic() + 15
    for _ in range(40):  # each round commits up to 5 tokens; the quota is 60 a minute
        try:
            list(stub.Generate(pb.GenerateRequest(prompt_ids=[5, 6], max_new_tokens=20), metadata=md(TIGHT), timeout=30))
        except grpc.RpcError as exc:
            if "open sessions" in (exc.details() or "") and time.monotonic() < slot_deadline:
                time.sleep(0.5)
                continue
            refusal = exc
            break
    assert refusal is not None and refusal.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "tokens in the last minute" in refusal.details() and "retry after" in refusal.details()


# ---- silent and slow streams, admission -----------------------------------------------------


def test_a_silent_stream_is_closed_within_the_first_message_deadline(stub, healthy):
    session = Session(stub)
    refused(session.reply, grpc.StatusCode.DEADLINE_EXCEEDED, "no Open within", within=FIRST_MESSAGE_S + FAST_S)
    session.close()


def test_an_idle_session_is_closed(stub, info, healthy):
    session = opened(stub, info)
    refused(session.reply, grpc.StatusCode.DEADLINE_EXCEEDED, "idle", within=IDLE_S + FAST_S)
    session.close()


def test_silent_streams_cannot_keep_a_healthy_open_waiting(stub, info, healthy):
    """More silent streams than Serve has slots and queue: a new Open is answered at once (opened,
    or RESOURCE_EXHAUSTED from the bounded queue), never left waiting, and once the silent ones
    hit the first-message deadline an Open is served again."""
    silent = [Session(stub) for _ in range(60)]  # never send anything
    try:
        time.sleep(0.5)
        started = time.monotonic()
        session = Session(stub)
        session.send(open=open_msg(info))
        try:
            assert session.reply().HasField("opened")
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (exc.code(), exc.details())
        assert time.monotonic() - started < FAST_S
        session.close()
        deadline = time.monotonic() + FIRST_MESSAGE_S + 2 * FAST_S
        while True:
            session = Session(stub)
            session.send(open=open_msg(info))
            try:
                assert session.reply().HasField("opened")
                break
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and time.monotonic() < deadline, exc.details()
                time.sleep(0.5)
            finally:
                session.close()
    finally:
        for s in silent:
            s.close()


def test_unauthenticated_silent_streams_are_refused_at_once(stub, healthy):
    started = time.monotonic()
    streams = [Session(stub, key=None) for _ in range(30)]
    for s in streams:
        refused(s.reply, grpc.StatusCode.UNAUTHENTICATED, within=FAST_S + 5)
    assert time.monotonic() - started < FAST_S + 5


SILENT_CROWD = 200
STALL_BOUND_S = 2.0  # the goal: the healthy session's longest gap, and a new Open's answer


class TimedDevice:
    """A well-behaved device generating over and over on its own thread, noting on its own clock
    when each generation starts and when each piece of text arrives (a piece is a verdict's
    tokens), so a stall shows as the longest gap between two of those moments."""

    def __init__(self, server):
        import threading

        self.server, self.moments, self.results, self.errors = server, [], [], []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        from helpers import PROMPTS

        try:
            with EdgeClient(self.server.address, self.server.pair.draft_dir, api_key=HEALTHY) as client:
                ids = client.encode(PROMPTS[0])
                while not self.stop.is_set():
                    self.moments.append(time.perf_counter())
                    with client.stream(ids, max_new_tokens=40, k=2, stop_token_ids=()) as stream:
                        for _ in stream:
                            self.moments.append(time.perf_counter())
                    self.results.append((ids, stream.token_ids))
        except Exception as exc:
            self.errors.append(exc)

    def longest_gap(self, start: float, end: float) -> float:
        moments = [start, *(t for t in self.moments if start < t < end), end]
        return max(b - a for a, b in zip(moments, moments[1:]))


def hold_silent_streams(address: str, count: int, hold_s: float) -> list[tuple[str, float]]:
    """``count`` Session streams with a valid key that never send, over connections of 50 streams
    each (an attacker is not bound by one connection's HTTP/2 stream limit); returns how each
    ended (status code name, or "held" if it was still open after ``hold_s``) and when."""
    import asyncio

    async def attack():
        channels = [grpc.aio.insecure_channel(address) for _ in range(-(-count // 50))]
        started = time.perf_counter()

        async def one(i: int):
            call = pb_grpc.SpeculativeStub(channels[i // 50]).Session(metadata=md(GOOD))
            try:
                await asyncio.wait_for(call.read(), hold_s)
                return "replied", time.perf_counter() - started
            except asyncio.TimeoutError:
                call.cancel()
                return "held", hold_s
            except grpc.aio.AioRpcError as exc:
                return exc.code().name, time.perf_counter() - started

        try:
            return await asyncio.gather(*(one(i) for i in range(count)))
        finally:
            for channel in channels:
                await channel.close()

    return asyncio.run(attack())


def new_device_open(address: str, info, key: str) -> tuple[float, str]:
    """Another device's Open over its own connection: seconds to the answer, and the answer
    ("opened" or the status code's name)."""
    with grpc.insecure_channel(address) as channel:
        grpc.channel_ready_future(channel).result(timeout=30)
        session = RawSession(pb_grpc.SpeculativeStub(channel), md(key))
        started = time.perf_counter()
        session.send(open=open_msg(info))
        try:
            answer = "opened" if session.reply().HasField("opened") else "other"
        except grpc.RpcError as exc:
            answer = exc.code().name
        elapsed = time.perf_counter() - started
        session.close()
        return elapsed, answer


def test_two_hundred_silent_streams_stall_no_one(server, info, healthy, target_model):
    """More silent streams than Serve's slots and queue hold (issue 23): the verifier refuses
    those over its bound on streams waiting for their Open at once, so a healthy session's
    verdicts and a new device's Open are never queued behind them."""
    import threading

    device = TimedDevice(server)
    try:
        deadline = time.monotonic() + 60
        while len(device.results) < 2 and not device.errors and time.monotonic() < deadline:
            time.sleep(0.1)  # its first generations: the draft and the channel are warm
        ends: list = []
        attack = threading.Thread(target=lambda: ends.extend(
            hold_silent_streams(server.address, SILENT_CROWD, FIRST_MESSAGE_S + 2.5)))
        start = time.perf_counter()
        attack.start()
        probes = []
        time.sleep(0.3)
        while attack.is_alive():
            probes.append(("healthy", *new_device_open(server.address, info, HEALTHY)))
            probes.append(("attacker's key", *new_device_open(server.address, info, GOOD)))
            time.sleep(0.2)
        attack.join()
        gap = device.longest_gap(start, time.perf_counter())
    finally:
        device.stop.set()
        device.thread.join(timeout=60)
    outcomes = {code: sum(1 for c, _ in ends if c == code) for code, _ in ends}
    print(f"{SILENT_CROWD} silent streams: healthy longest gap {gap:.2f}s, new Opens {[(w, round(s, 2), a) for w, s, a in probes]},"
          f" silent streams ended {outcomes}")
    # Each silent stream was refused at once or closed at the first-message deadline; none held a slot longer.
    assert set(outcomes) <= {"RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"}, outcomes
    assert max(t for _, t in ends) < FIRST_MESSAGE_S + FAST_S
    assert probes and all(answer in ("opened", "RESOURCE_EXHAUSTED") for _, _, answer in probes), probes
    assert all(answer == "opened" for who, _, answer in probes if who == "healthy"), probes
    assert max(seconds for _, seconds, _ in probes) <= STALL_BOUND_S, probes
    assert gap <= STALL_BOUND_S, f"the healthy session waited {gap:.2f}s between verdicts"
    assert not device.errors, device.errors
    expected = reference_greedy(target_model, device.results[0][0], 40)
    assert device.results and all(tokens == expected for _, tokens in device.results)


def open_until_refused(stub, info, attempts: int, held: list, **open_fields) -> grpc.RpcError | None:
    """Opens sessions (kept in ``held``) until one is refused; returns that refusal."""
    for _ in range(attempts):
        session = Session(stub)
        session.send(open=open_msg(info, **open_fields))
        try:
            assert session.reply().HasField("opened")
            held.append(session)
        except grpc.RpcError as exc:
            return exc
    return None


def test_sessions_beyond_the_replica_are_refused_fast(stub, info, healthy):
    held = []
    try:
        refusal = open_until_refused(stub, info, MAX_SESSIONS + 1, held)
        assert refusal is not None and refusal.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "capacity" in refusal.details() or "KV cache budget" in refusal.details()
    finally:
        for session in held:
            session.close()


def test_sessions_whose_kv_reservations_pass_the_budget(stub, info, healthy):
    # Each reserves a full context (200 + 56 tokens x 1 KiB = a quarter of the budget) at Open.
    held = []
    try:
        refusal = open_until_refused(stub, info, 6, held, prompt_ids=[5] * 200, max_new_tokens=56)
        assert refusal is not None and refusal.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "KV cache budget" in refusal.details() and "max_new_tokens" in refusal.details()
        assert len(held) <= 4
    finally:
        for session in held:
            session.close()


# ---- size and garbage ------------------------------------------------------------------------


def test_a_50_megabyte_open_is_refused_without_growing_the_replica(stub, info, healthy):
    before = rss(stub)
    session_refused(stub, info, grpc.StatusCode.RESOURCE_EXHAUSTED, prompt_ids=[5] * 10_000_000, within=FAST_S + 5)
    assert rss(stub) - before < 64 << 20


def test_an_open_over_the_deployments_cap_is_refused_before_parsing(stub, info, healthy):
    # Under the transport's 1 MiB but over the deployment's cap (10 bytes a token of a 256 context + 5 KiB).
    session_refused(stub, info, grpc.StatusCode.RESOURCE_EXHAUSTED, "limit", prompt_ids=[5] * 100_000)


def test_a_q_over_max_q_entries(stub, info, healthy):
    session = opened(stub, info, mode=pb.VERIFY_MODE_EXACT, sampling=pb.SamplingParams(temperature=1.0))
    q = pb.SparseDistribution(token_ids=list(range(100)), probs=[0.01] * 100)
    session.send(draft=pb.Draft(round=0, token_ids=[1], q=[q]))
    refused(session.reply, grpc.StatusCode.INVALID_ARGUMENT, "at most 64")
    session.close()


GARBAGE = {"truncated varint": b"\x0a\xff", "wrong wire type": b"\x0f\x01\x02", "random bytes": bytes(range(200, 256)) * 3}


@pytest.mark.parametrize("case", list(GARBAGE))
def test_garbage_bytes_on_session(channel, healthy, case):
    call = channel.stream_stream("/edgespec.v1.Speculative/Session", request_serializer=None,
                                 response_deserializer=pb.SessionResponse.FromString)
    refused(lambda: list(call(iter([GARBAGE[case]]), metadata=md(), timeout=30)), grpc.StatusCode.INVALID_ARGUMENT,
            "not a valid edgespec.v1.SessionRequest")


@pytest.mark.parametrize("method", ["Generate", "Info"])
def test_garbage_bytes_on_unary_calls(channel, healthy, method):
    if method == "Generate":
        call = channel.unary_stream(f"/edgespec.v1.Speculative/{method}", request_serializer=None,
                                    response_deserializer=pb.GenerateResponse.FromString)
        run = lambda: list(call(GARBAGE["truncated varint"], metadata=md(), timeout=30))  # noqa: E731
    else:
        call = channel.unary_unary(f"/edgespec.v1.Speculative/{method}", request_serializer=None,
                                   response_deserializer=pb.InfoResponse.FromString)
        run = lambda: call(GARBAGE["truncated varint"], metadata=md(), timeout=30)  # noqa: E731
    refused(run, grpc.StatusCode.INVALID_ARGUMENT, "not a valid")


def test_garbage_on_health(channel, healthy):
    from grpc_health.v1 import health_pb2

    call = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=None,
                               response_deserializer=health_pb2.HealthCheckResponse.FromString)
    refused(lambda: call(GARBAGE["wrong wire type"], timeout=30), grpc.StatusCode.INVALID_ARGUMENT)


# ---- bad numbers ------------------------------------------------------------------------------

NUMBER_CASES = {
    "denormal temperature": (dict(temperature=1e-40), "temperature"),
    "infinite temperature": (dict(temperature=float("inf")), "temperature"),
    "NaN temperature": (dict(temperature=float("nan")), "temperature"),
    "huge temperature": (dict(temperature=1e6), "temperature"),
    "NaN top_p": (dict(temperature=1.0, top_p=float("nan")), "top_p"),
    "negative top_p": (dict(temperature=1.0, top_p=-0.1), "top_p"),
    "top_p above 1": (dict(temperature=1.0, top_p=1.5), "top_p"),
    "negative top_k": (dict(temperature=1.0, top_k=-5), "top_k"),
}


@pytest.mark.parametrize("case", list(NUMBER_CASES))
def test_bad_numbers_in_a_session(stub, info, healthy, case):
    sampling, field = NUMBER_CASES[case]
    session_refused(stub, info, grpc.StatusCode.INVALID_ARGUMENT, field, mode=pb.VERIFY_MODE_TOKEN,
                    sampling=pb.SamplingParams(**sampling))


@pytest.mark.parametrize("case", list(NUMBER_CASES))
def test_bad_numbers_in_generate(stub, healthy, case):
    sampling, field = NUMBER_CASES[case]
    refused(lambda: list(stub.Generate(pb.GenerateRequest(prompt_ids=[5], sampling=pb.SamplingParams(**sampling)),
                                       metadata=md(), timeout=30)), grpc.StatusCode.INVALID_ARGUMENT, field)


# ---- send-ahead and trees ---------------------------------------------------------------------

ABUSE = {
    "ahead block with a token outside the vocabulary": (dict(), dict(round=1, token_ids=[10**6], ahead=True, assumed_token=3),
                                                         grpc.StatusCode.INVALID_ARGUMENT, "outside"),
    "ahead block with k above max_k": (dict(), dict(round=1, token_ids=[1] * 9, ahead=True), grpc.StatusCode.INVALID_ARGUMENT, "max_k"),
    "ahead tree": (dict(), dict(round=0, token_ids=[1], parents=[-1], ahead=True), grpc.StatusCode.INVALID_ARGUMENT, "chain"),
    "tree parent after its child": (dict(), dict(round=0, token_ids=[1, 2], parents=[1, -1]), grpc.StatusCode.INVALID_ARGUMENT, "parent"),
    "tree parent index out of range": (dict(), dict(round=0, token_ids=[1, 2], parents=[-1, 7]), grpc.StatusCode.INVALID_ARGUMENT, "parent"),
    "tree with duplicate siblings": (dict(), dict(round=0, token_ids=[4, 4], parents=[-1, -1]), grpc.StatusCode.INVALID_ARGUMENT, "siblings"),
    "tree without one parent per token": (dict(), dict(round=0, token_ids=[4, 5], parents=[-1]), grpc.StatusCode.INVALID_ARGUMENT, "parent"),
    "tree over max_tree_tokens": (dict(), dict(round=0, token_ids=list(range(40)), parents=[-1] + list(range(39))),
                                  grpc.StatusCode.INVALID_ARGUMENT, "max_tree_tokens"),
    "tree in a sampling session": (dict(mode=pb.VERIFY_MODE_TOKEN, sampling=pb.SamplingParams(temperature=1.0)),
                                   dict(round=0, token_ids=[1], parents=[-1]), grpc.StatusCode.INVALID_ARGUMENT, "greedy"),
}


@pytest.mark.parametrize("case", list(ABUSE))
def test_send_ahead_and_tree_abuse(stub, info, healthy, case):
    open_fields, draft, code, fragment = ABUSE[case]
    session = opened(stub, info, **open_fields)
    session.send(draft=pb.Draft(**draft))
    refused(session.reply, code, fragment)
    session.close()


def test_a_stale_ahead_block_is_discarded_and_costs_no_forward(stub, info, healthy):
    session = opened(stub, info)
    session.send(draft=pb.Draft(round=0, token_ids=[1, 2]))
    session.send(draft=pb.Draft(round=1, token_ids=[3], ahead=True, assumed_token=10**5 % 500))
    verdict, ahead = session.reply().verdict, session.reply().verdict
    assert ahead.discarded and ahead.round == 1 and ahead.batch_size == 0
    session.send(draft=pb.Draft(round=1, token_ids=[3]))  # the fresh block for the same round
    assert session.reply().verdict.round == 1 and verdict.round == 0
    session.close()


# ---- cancelled prefills ------------------------------------------------------------------------


def test_cancelling_during_prefill_leaks_nothing(stub, info, healthy):
    base_sessions = stub.Info(pb.InfoRequest(), metadata=md(), timeout=30).active_sessions
    before = rss(stub)
    for i in range(30):
        session = Session(stub)
        session.send(open=open_msg(info, prompt_ids=[(i + j) % 500 for j in range(250)], max_new_tokens=4))
        time.sleep(0.01)
        session.close()  # while the prompt is being prefilled
    # Back to the count before (the healthy device's session, if it had one open then): the
    # replica ends a cancelled prefill when it next looks, later on a loaded machine, and the
    # healthy device opens and closes sessions of its own meanwhile, so poll for it.
    deadline = time.monotonic() + 60
    while (after := stub.Info(pb.InfoRequest(), metadata=md(), timeout=30)).active_sessions > base_sessions:
        assert time.monotonic() < deadline, f"{after.active_sessions} sessions open a minute on, {base_sessions} before"
        time.sleep(0.05)
    assert after.replica_rss_bytes - before < 32 << 20


def test_messages_after_close_and_close_before_open(stub, info, healthy):
    session = Session(stub)
    session.send(close=pb.Close())
    with pytest.raises(StopIteration):
        session.reply()  # a Close with no session just ends the stream, OK
    session.close()


def test_healthy_session_was_never_disturbed(healthy, target_model):
    check_healthy_device(healthy, target_model, min_results=3)
