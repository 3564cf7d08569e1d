"""A black-box conformance suite for docs/protocol.md: raw gRPC stubs only (no SDK, no model),
so it checks any server (or, read as a script of expected exchanges, any client port).

    EDGESPEC_CONFORMANCE_ADDRESS=host:port [EDGESPEC_CONFORMANCE_KEY=...] pytest tests/conformance

Without the variable it runs against the tiny test verifier the e2e modules share. The target's
own greedy output comes from Generate; every check follows from the protocol: a Session commits
exactly that output whatever the drafts, drafts equal to it are all accepted, the budget edge,
stop tokens, resume, send-ahead, trees, seeded sampling, health, reflection and the documented
statuses.
"""

from __future__ import annotations

import os
import queue
import random

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2

from edgespec.v1 import speculative_pb2 as pb
from edgespec.v1 import speculative_pb2_grpc as pb_grpc

pytestmark = pytest.mark.slow
ADDRESS = os.environ.get("EDGESPEC_CONFORMANCE_ADDRESS")
KEY = os.environ.get("EDGESPEC_CONFORMANCE_KEY")
METADATA = (("authorization", f"Bearer {KEY}"),) if KEY else ()
PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]
N = 24


if ADDRESS:

    @pytest.fixture(scope="module")
    def address():
        return ADDRESS

else:

    @pytest.fixture(scope="module")
    def address(server):
        """The tests' shared verifier (tests/conftest.py): the checks hold for any settings."""
        return server.address


@pytest.fixture(scope="module")
def channel(address):
    with grpc.insecure_channel(address) as channel:
        yield channel


@pytest.fixture(scope="module")
def stub(channel):
    return pb_grpc.SpeculativeStub(channel)


@pytest.fixture(scope="module")
def info(stub):
    return stub.Info(pb.InfoRequest(), metadata=METADATA, timeout=30)


def generate(stub, info, prompt, n, **fields) -> tuple[list[int], int]:
    request = pb.GenerateRequest(prompt_ids=prompt, max_new_tokens=n, tokenizer_fingerprint=info.tokenizer_fingerprint, **fields)
    tokens, finish = [], None
    for reply in stub.Generate(request, metadata=METADATA, timeout=60):
        tokens += reply.token_ids
        if reply.finished:
            finish = reply.finish_reason
    return tokens, finish


@pytest.fixture(scope="module")
def reference(stub, info):
    tokens, finish = generate(stub, info, PROMPT, N)
    assert len(tokens) == N and finish == pb.FINISH_REASON_LENGTH
    return tokens


class Session:
    def __init__(self, stub, info, prompt=PROMPT, **open_fields):
        self.requests: queue.Queue = queue.Queue()
        self.replies = stub.Session(iter(self.requests.get, None), metadata=METADATA, timeout=60)
        fields = dict(prompt_ids=prompt, mode=pb.VERIFY_MODE_GREEDY, tokenizer_fingerprint=info.tokenizer_fingerprint)
        fields.update(open_fields)
        self.send(open=pb.Open(**fields))
        self.opened = self.reply().opened

    def send(self, **kind) -> None:
        self.requests.put(pb.SessionRequest(**kind))

    def reply(self) -> pb.SessionResponse:
        return next(self.replies)

    def draft(self, round_no: int, tokens, **fields) -> pb.Verdict:
        self.send(draft=pb.Draft(round=round_no, token_ids=tokens, **fields))
        return self.reply().verdict

    def close(self) -> pb.Closed | None:
        self.send(close=pb.Close())
        self.requests.put(None)
        closed = None
        for reply in self.replies:
            if reply.HasField("closed"):
                closed = reply.closed
        return closed


def committed(verdict: pb.Verdict, drafts) -> list[int]:
    path = list(verdict.accepted_path) if verdict.accepted_path else list(range(verdict.accepted))
    return [drafts[i] for i in path] + [verdict.next_token]


# ---- what the server says about itself --------------------------------------------------------


def test_info_describes_the_deployment(info):
    assert info.tokenizer_fingerprint and info.vocab_size > 0 and info.max_context > len(PROMPT) + N
    assert info.max_k >= 1 and pb.VERIFY_MODE_GREEDY in info.modes and info.max_new_tokens >= N
    assert info.max_sessions > 0 and info.default_max_new_tokens > 0 and info.max_message_bytes > 0


def test_health_answers_serving(channel):
    health = health_pb2_grpc.HealthStub(channel)
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == health_pb2.HealthCheckResponse.SERVING
    assert health.Check(health_pb2.HealthCheckRequest(service="edgespec.v1.Speculative"), timeout=10).status == \
        health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("version", ["v1", "v1alpha"])
def test_reflection_lists_the_service(channel, version):
    method = f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo"
    call = channel.stream_stream(method, request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
                                 response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)
    (reply,) = list(call(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), metadata=METADATA, timeout=10))
    assert "edgespec.v1.Speculative" in [s.name for s in reply.list_services_response.service]


# ---- the round ----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_any_drafts_commit_exactly_the_targets_output(stub, info, reference, seed):
    rng = random.Random(seed)
    session = Session(stub, info, max_new_tokens=N)
    out, round_no = [], 0
    while True:
        k = rng.randint(1, info.max_k)
        drafts = [reference[len(out) + i] if len(out) + i < N and rng.random() < 0.6 else rng.randrange(info.vocab_size)
                  for i in range(k)]
        verdict = session.draft(round_no, drafts)
        assert verdict.round == round_no and 0 <= verdict.accepted <= k
        out += committed(verdict, drafts)
        round_no += 1
        if verdict.finished:
            break
    assert out == reference and verdict.finish_reason == pb.FINISH_REASON_LENGTH
    closed = session.close()
    assert closed is not None and closed.rounds == round_no and closed.generated_tokens == N


def test_drafts_equal_to_the_output_are_all_accepted_with_a_bonus(stub, info, reference):
    session = Session(stub, info, max_new_tokens=N)
    k = min(4, info.max_k)
    verdict = session.draft(0, reference[:k])
    assert verdict.accepted == k and verdict.next_token == reference[k] and not verdict.finished
    session.close()


def test_the_budget_edge_cuts_the_round_and_reports_the_last_kept_token(stub, info, reference):
    session = Session(stub, info, max_new_tokens=3)
    k = min(6, info.max_k)
    verdict = session.draft(0, reference[:k])
    assert (verdict.accepted, verdict.next_token, verdict.finished) == (2, reference[2], True)
    assert verdict.finish_reason == pb.FINISH_REASON_LENGTH
    session.close()


def test_a_stop_token_ends_the_output_including_it(stub, info, reference):
    stop = reference[3]
    end = reference.index(stop)
    session = Session(stub, info, max_new_tokens=N, stop_token_ids=[stop])
    k = min(8, info.max_k)
    out, round_no = [], 0
    while True:
        drafts = (reference[len(out):] + [0] * k)[:k]
        verdict = session.draft(round_no, drafts)
        out += committed(verdict, drafts)
        round_no += 1
        if verdict.finished:
            break
    assert out == reference[: end + 1] and verdict.finish_reason == pb.FINISH_REASON_STOP_TOKEN
    session.close()


def test_a_resumed_session_continues_the_same_output(stub, info, reference):
    first = Session(stub, info, max_new_tokens=N)
    verdict = first.draft(0, [0])
    head = committed(verdict, [0])
    first.close()
    second = Session(stub, info, prompt=PROMPT + head, max_new_tokens=N - len(head), first_round=1)
    out, round_no = list(head), 1
    while True:
        verdict = second.draft(round_no, [1, 2])
        out += committed(verdict, [1, 2])
        round_no += 1
        if verdict.finished:
            break
    assert out == reference
    second.close()


def test_generate_continues_from_committed_tokens(stub, info, reference):
    tail, finish = generate(stub, info, PROMPT + reference[:10], N - 10, first_round=10)
    assert tail == reference[10:] and finish == pb.FINISH_REASON_LENGTH


# ---- send-ahead and trees -----------------------------------------------------------------------


def test_a_block_sent_ahead_is_verified_when_its_assumption_holds(stub, info, reference):
    if not info.send_ahead:
        pytest.skip("this server does not accept blocks sent ahead")
    k = min(3, info.max_k)
    session = Session(stub, info, max_new_tokens=N)
    session.send(draft=pb.Draft(round=0, token_ids=reference[:k]))
    ahead = reference[k + 1 : 2 * k + 1]
    session.send(draft=pb.Draft(round=1, token_ids=ahead, ahead=True, assumed_token=reference[k]))
    first, second = session.reply().verdict, session.reply().verdict
    assert first.accepted == k and not second.discarded and second.round == 1
    assert committed(second, ahead) == reference[k + 1 : k + 1 + second.accepted + 1]
    session.close()


def test_a_block_sent_ahead_on_a_wrong_assumption_is_discarded(stub, info, reference):
    if not info.send_ahead:
        pytest.skip("this server does not accept blocks sent ahead")
    session = Session(stub, info, max_new_tokens=N)
    wrong = (reference[0] + 1) % info.vocab_size
    session.send(draft=pb.Draft(round=0, token_ids=[wrong]))  # rejected: the round emits reference[0]
    session.send(draft=pb.Draft(round=1, token_ids=[1, 2], ahead=True, assumed_token=3))
    first, second = session.reply().verdict, session.reply().verdict
    assert first.accepted == 0 and first.next_token == reference[0]
    assert second.discarded and second.accepted == 0
    fresh = session.draft(1, reference[1:3])  # the same round again, fresh
    assert not fresh.discarded and fresh.accepted == 2
    session.close()


def test_a_tree_accepts_the_branch_that_matches(stub, info, reference):
    if info.max_tree_tokens < 3:
        pytest.skip("this server does not verify trees")
    wrong = (reference[1] + 1) % info.vocab_size
    tokens, parents = [reference[0], wrong, reference[1]], [-1, 0, 0]  # two children of the first token
    session = Session(stub, info, max_new_tokens=N)
    verdict = session.draft(0, tokens, parents=parents)
    assert list(verdict.accepted_path) == [0, 2] and verdict.next_token == reference[2]
    session.close()


# ---- sampling -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [pb.VERIFY_MODE_TOKEN, pb.VERIFY_MODE_EXACT])
def test_seeded_sampling_gives_the_same_verdicts(stub, info, mode):
    if mode not in info.modes:
        pytest.skip("mode not served")
    sampling = pb.SamplingParams(temperature=0.9, seed=11)
    outputs = []
    for _ in range(2):
        session = Session(stub, info, max_new_tokens=12, mode=mode, sampling=sampling)
        out = []
        for round_no in range(4):
            q = [pb.SparseDistribution(token_ids=[1, 2], probs=[0.5, 0.5])] if mode == pb.VERIFY_MODE_EXACT else []
            verdict = session.draft(round_no, [1], q=q)
            out += committed(verdict, [1])
            if verdict.finished:
                break
        session.close()
        outputs.append(out)
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("seed", [3, 4])
def test_coupled_sessions_commit_exactly_the_seeded_generate_output(stub, info, seed):
    """VERIFY_MODE_COUPLED: draws keyed by (seed, absolute position), so any drafts, any k, and a
    resume in the middle commit exactly what Generate samples with the same seed."""
    if pb.VERIFY_MODE_COUPLED not in info.modes:
        pytest.skip("coupled mode not served")
    sampling = pb.SamplingParams(temperature=1.0, seed=seed)
    reference, _ = generate(stub, info, PROMPT, N, sampling=sampling)
    assert len(reference) == N
    rng = random.Random(seed)
    out, round_no = [], 0
    for segment_end in (10, N):  # a session, then a resume from every committed token
        session = Session(stub, info, prompt=PROMPT + out, max_new_tokens=N - len(out), mode=pb.VERIFY_MODE_COUPLED,
                          sampling=sampling, first_round=round_no)
        while len(out) < segment_end:
            k = rng.randint(1, info.max_k)
            drafts = [reference[len(out) + i] if len(out) + i < N and rng.random() < 0.7 else rng.randrange(info.vocab_size)
                      for i in range(k)]
            verdict = session.draft(round_no, drafts)
            out += committed(verdict, drafts)
            round_no += 1
            if verdict.finished:
                break
        session.close()
    assert out == reference and verdict.finish_reason == pb.FINISH_REASON_LENGTH
    other, _ = generate(stub, info, PROMPT, N, sampling=pb.SamplingParams(temperature=1.0, seed=seed + 10))
    assert other != reference


def test_a_sampled_generate_sends_the_probability_of_each_token_it_drew(stub, info, reference):
    """``GenerateResponse.token_probs``: one p(t) per token of a sampled stream, in (0, 1]; none
    for a greedy one. With top_k = 1 the target's distribution is its argmax alone: the greedy
    text, each token drawn with probability 1."""
    def replies(sampling=None):
        request = pb.GenerateRequest(prompt_ids=PROMPT, max_new_tokens=N, tokenizer_fingerprint=info.tokenizer_fingerprint,
                                     sampling=sampling)
        return list(stub.Generate(request, metadata=METADATA, timeout=60))

    certain = replies(pb.SamplingParams(temperature=1.0, top_k=1, seed=5))
    assert [t for r in certain for t in r.token_ids] == reference
    assert [p for r in certain for p in r.token_probs] == [1.0] * N
    sampled = replies(pb.SamplingParams(temperature=1.0, seed=6))
    assert all(len(r.token_probs) == len(r.token_ids) for r in sampled)
    probs = [p for r in sampled for p in r.token_probs]
    assert len(probs) == N and all(0.0 < p <= 1.0 for p in probs) and min(probs) < 1.0
    assert all(not r.token_probs for r in replies())


# ---- statuses -----------------------------------------------------------------------------------


def status_of(stub, info, *messages) -> grpc.StatusCode:
    requests: queue.Queue = queue.Queue()
    replies = stub.Session(iter(requests.get, None), metadata=METADATA, timeout=30)
    for message in messages:
        requests.put(message)
    try:
        for _ in replies:
            pass
    except grpc.RpcError as exc:
        return exc.code()
    finally:
        requests.put(None)
    return grpc.StatusCode.OK


def open_request(info, **fields) -> pb.SessionRequest:
    base = dict(prompt_ids=PROMPT, mode=pb.VERIFY_MODE_GREEDY, tokenizer_fingerprint=info.tokenizer_fingerprint)
    return pb.SessionRequest(open=pb.Open(**(base | fields)))


STATUS_CASES = {
    "draft before open": (lambda info: [pb.SessionRequest(draft=pb.Draft(round=0, token_ids=[1]))], grpc.StatusCode.FAILED_PRECONDITION),
    "wrong fingerprint": (lambda info: [open_request(info, tokenizer_fingerprint="bpe-1-0000")], grpc.StatusCode.FAILED_PRECONDITION),
    "prompt outside the vocabulary": (lambda info: [open_request(info, prompt_ids=[info.vocab_size])], grpc.StatusCode.INVALID_ARGUMENT),
    "empty prompt": (lambda info: [open_request(info, prompt_ids=[])], grpc.StatusCode.INVALID_ARGUMENT),
    "k above max_k": (lambda info: [open_request(info), pb.SessionRequest(draft=pb.Draft(round=0, token_ids=[1] * (info.max_k + 1)))],
                      grpc.StatusCode.INVALID_ARGUMENT),
    "wrong round": (lambda info: [open_request(info), pb.SessionRequest(draft=pb.Draft(round=5, token_ids=[1]))],
                    grpc.StatusCode.FAILED_PRECONDITION),
    "sampling mode at temperature 0": (lambda info: [open_request(info, mode=pb.VERIFY_MODE_TOKEN)], grpc.StatusCode.INVALID_ARGUMENT),
    "max_new_tokens over the limit": (lambda info: [open_request(info, max_new_tokens=info.max_new_tokens + 1)],
                                      grpc.StatusCode.OUT_OF_RANGE),
}


@pytest.mark.parametrize("case", list(STATUS_CASES))
def test_documented_statuses(stub, info, case):
    messages, code = STATUS_CASES[case]
    assert status_of(stub, info, *messages(info)) == code


@pytest.mark.parametrize("method", ["Session", "Generate", "Info"])
def test_bytes_that_are_not_the_message_are_invalid_argument(channel, method):
    path = f"/edgespec.v1.Speculative/{method}"
    garbage = b"\xff\xff\xff\xff\x0f"
    identity = lambda raw: raw  # noqa: E731
    with pytest.raises(grpc.RpcError) as caught:
        if method == "Session":
            list(channel.stream_stream(path, request_serializer=identity, response_deserializer=identity)(
                iter([garbage]), metadata=METADATA, timeout=10))
        elif method == "Generate":
            list(channel.unary_stream(path, request_serializer=identity, response_deserializer=identity)(
                garbage, metadata=METADATA, timeout=10))
        else:
            channel.unary_unary(path, request_serializer=identity, response_deserializer=identity)(garbage, metadata=METADATA, timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
