"""A scripted verifier: a real gRPC server speaking docs/protocol.md that plays scenarios, so a
client port in any language can be checked without a model (docs/conformance.md says how).

Its "target" is a rule, not a model: in each scenario the verifier accepts a scripted number of
drafts whatever they are (``Scenario.accept``; a draft that is the stop token ends the accepted
run), then emits the next token of a fixed sequence (``target_token``). It records everything
it committed and every way the client broke the contract (``Record.violations``): an Open that
does not resume from every committed token with the right round and budget, a wrong round, a
Draft after the finish, a retry of a refusal that says not to. A client passes a scenario when
the server saw no violation and the client's output is exactly what the server committed
(``check``).

The scenario is named by the prompt's first token (``Scenario.prompt``), so one server plays
them all, over gRPC or over the WebSocket transport (``--transport websocket``: the same
servicer behind ``ws://HOST:PORT/v1/session``, ``/v1/generate`` and ``GET /v1/info``; its
refusals close the connection with 4000 + their status code). Command line::

    python tests/conformance/scripted_verifier.py list
    python tests/conformance/scripted_verifier.py serve --port 50070 --fingerprint F --vocab-size V --report r.json [--transport websocket]
    python tests/conformance/scripted_verifier.py check --report r.json --results results.jsonl
    python tests/conformance/scripted_verifier.py sdk --draft DRAFT_DIR   # the Python SDK, every scenario
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from concurrent import futures
from dataclasses import asdict, dataclass, field

import grpc

from edgespec.edge.errors import DRAINING_MESSAGE, RETRYABLE_CODES
from edgespec.v1 import speculative_pb2 as pb
from edgespec.v1 import speculative_pb2_grpc as pb_grpc

MAX_K = 8
MAX_CONTEXT = 4096
K = 4  # the block size a client should use (any k <= MAX_K conforms)
FINISH_NAMES = {pb.FINISH_REASON_STOP_TOKEN: "stop_token", pb.FINISH_REASON_LENGTH: "length"}


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str
    rpc: str = "Session"  # or "Generate" (cloud-only)
    max_new_tokens: int = 16
    accept: int | None = None  # drafts accepted per round (None: all, then a bonus token)
    send_ahead: int = 1  # blocks a client should keep in flight
    stop_at_round: int | None = None  # that verified round's next token is the stop token
    cut_after: int | None = None  # the first stream ends after this many verdicts (Generate: messages)
    cut_code: str = "UNAVAILABLE"
    draining: bool = False  # the cut is a drain: the last answer says so, the status names it
    refuse: str | None = None  # the first Open (Generate) is refused with this status code

    @property
    def number(self) -> int:
        return SCENARIOS.index(self) + 1

    @property
    def prompt(self) -> list[int]:
        return [self.number, 10, 11, 12]

    @property
    def expect_error(self) -> str | None:
        """The status the client must end with (no retry), or None: it must finish."""
        if self.refuse and grpc.StatusCode[self.refuse] not in RETRYABLE_CODES:
            return self.refuse
        return None


SCENARIOS: list[Scenario] = [
    Scenario("all_accepted", "every draft accepted, then a bonus token each round"),
    Scenario("reject_at_2", "two drafts accepted, then a corrected token each round", accept=2),
    Scenario("reject_at_0", "no draft accepted: one corrected token a round", accept=0),
    Scenario("budget_edge", "the last round is cut at max_new_tokens: accepted counts the kept drafts", max_new_tokens=7),
    Scenario("stop_token", "the third round ends with the stop token (included in the output)", stop_at_round=2),
    Scenario("discarded_ahead", "blocks sent ahead of a rejecting round come back discarded", accept=1, send_ahead=3),
    Scenario("ahead_kept", "blocks sent ahead of whole-block rounds are verified when their guess holds", send_ahead=2),
    Scenario("drain_reopen", "a verdict says draining, the stream ends: reopen with every committed token",
             cut_after=2, draining=True),
    Scenario("resume_after_cut", "the stream breaks after two verdicts: resume from the committed tokens", cut_after=2),
    Scenario("cloud_only", "Generate streams the target's tokens", rpc="Generate"),
    Scenario("cloud_resume", "a Generate stream breaks: call again from the committed tokens", rpc="Generate", cut_after=5),
    *[Scenario(f"refuse_{code.lower()}", f"the first Open is refused with {code}", refuse=code) for code in (
        "RESOURCE_EXHAUSTED", "UNAVAILABLE", "DEADLINE_EXCEEDED", "INTERNAL", "ABORTED",
        "INVALID_ARGUMENT", "OUT_OF_RANGE", "FAILED_PRECONDITION", "UNAUTHENTICATED", "PERMISSION_DENIED")],
]


def target_token(context: list[int], vocab_size: int) -> int:
    """The scripted target's next token: never 0 nor the stop token (vocab_size - 1)."""
    return (context[-1] * 7 + len(context) * 3 + 1) % (vocab_size - 2) + 1


@dataclass
class Record:
    """What the verifier saw and committed for one scenario."""

    scenario: str
    committed: list[int] = field(default_factory=list)  # generated tokens, in order
    finish_reason: str = ""
    next_round: int = 0
    rounds: int = 0  # verified rounds
    streams: int = 0  # streams opened (refusals not counted)
    refusals: int = 0
    discarded: int = 0
    ahead_verified: int = 0
    violations: list[str] = field(default_factory=list)


class StreamState:
    def __init__(self, first_round: int):
        self.expected_round = first_round
        self.last_whole = False  # the last verdict accepted every draft of its block
        self.last_token: int | None = None
        self.answers = 0


def let_the_first_block_land(requests, wait_s: float = 0.5) -> None:
    """Waits (at most ``wait_s``) for the block a client may send right behind its Open.

    A refusal must reach the client as the code it was refused with. If the stream closes while
    the client's write of that first block is still in flight, gRPC's client libraries may
    report the write's failure (INTERNAL, which is retryable) instead of the server's status,
    and the kit would then fault a client for retrying what it was never told. Reading the block
    first keeps the scenario about the client's retry decision, not about that race."""
    landed = threading.Event()

    def read() -> None:
        try:
            next(requests, None)
        except Exception:  # the client went away: nothing to wait for
            pass
        landed.set()

    threading.Thread(target=read, daemon=True).start()
    landed.wait(wait_s)


class ScriptedVerifier(pb_grpc.SpeculativeServicer):
    def __init__(self, fingerprint: str, vocab_size: int, on_change=None):
        self.fingerprint, self.vocab_size, self.on_change = fingerprint, vocab_size, on_change
        self.stop = vocab_size - 1
        self.records: dict[str, Record] = {}
        self.lock = threading.Lock()

    # ---- Info ----------------------------------------------------------------------------

    def Info(self, request, context):
        return pb.InfoResponse(
            model_id="scripted", tokenizer_fingerprint=self.fingerprint, vocab_size=self.vocab_size,
            max_context=MAX_CONTEXT, max_k=MAX_K, modes=[pb.VERIFY_MODE_GREEDY], max_new_tokens=1024,
            version="scripted-1", send_ahead=True, max_tree_tokens=0, max_sessions=64, free_sessions=64,
            default_max_new_tokens=64, max_message_bytes=1 << 20, max_q_entries=1024)

    # ---- opening: every stream must resume from what was committed --------------------------

    def _begin(self, context, prompt_ids, first_round, max_new_tokens, stop_ids, fingerprint, before_refusal=None):
        number = prompt_ids[0] if prompt_ids else 0
        if not 1 <= number <= len(SCENARIOS):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"prompt_ids[0] must name a scenario (1..{len(SCENARIOS)})")
        scenario = SCENARIOS[number - 1]
        with self.lock:
            record = self.records.setdefault(scenario.name, Record(scenario.name))
        bad = record.violations.append
        if scenario.expect_error and record.refusals:
            bad(f"opened again after {scenario.refuse}, a status that says not to retry")
        if record.finish_reason:
            bad("opened again after the generation finished")
        if fingerprint != self.fingerprint:
            bad(f"tokenizer_fingerprint {fingerprint!r}, Info says {self.fingerprint!r}")
        if list(prompt_ids) != scenario.prompt + record.committed:
            bad(f"stream {record.streams + 1}: prompt_ids must be the prompt and every committed token "
                f"({len(scenario.prompt) + len(record.committed)} tokens), got {len(prompt_ids)}")
        if first_round != record.next_round:
            bad(f"stream {record.streams + 1}: first_round {first_round}, the next round is {record.next_round}")
        if max_new_tokens != scenario.max_new_tokens - len(record.committed):
            bad(f"stream {record.streams + 1}: max_new_tokens {max_new_tokens}, "
                f"{scenario.max_new_tokens - len(record.committed)} are left")
        if self.stop not in stop_ids:
            bad(f"stop_token_ids {list(stop_ids)} lack the scenario's stop token {self.stop}")
        if scenario.refuse and record.refusals == 0:
            record.refusals += 1
            self._changed()
            if before_refusal is not None:
                before_refusal()
            context.abort(grpc.StatusCode[scenario.refuse], f"scripted refusal: {scenario.refuse}")
        record.streams += 1
        return scenario, record

    # ---- Session -------------------------------------------------------------------------

    def Session(self, requests, context):
        first = next(requests, None)
        if first is None or first.WhichOneof("kind") != "open":
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "the first message of a session must be Open")
        o = first.open
        if o.mode != pb.VERIFY_MODE_GREEDY:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the scripted verifier serves greedy sessions only")
        scenario, record = self._begin(context, o.prompt_ids, o.first_round, o.max_new_tokens, o.stop_token_ids,
                                       o.tokenizer_fingerprint, before_refusal=lambda: let_the_first_block_land(requests))
        stream_index = record.streams
        yield pb.SessionResponse(opened=pb.Opened(session_id=f"{scenario.name}-{stream_index}", max_k=MAX_K,
                                                  max_context=MAX_CONTEXT, max_new_tokens=o.max_new_tokens,
                                                  model_id="scripted", replica_id="scripted-0"))
        stream = StreamState(o.first_round)
        try:
            for request in requests:
                kind = request.WhichOneof("kind")
                if kind == "close":
                    yield pb.SessionResponse(closed=pb.Closed(rounds=record.rounds, generated_tokens=len(record.committed)))
                    return
                if kind != "draft":
                    self._refuse(context, record, grpc.StatusCode.FAILED_PRECONDITION, "Open twice on one stream")
                verdict = self._verdict(context, scenario, record, stream, request.draft)
                stream.answers += 1
                cut = stream_index == 1 and stream.answers == scenario.cut_after and not verdict.finished
                verdict.draining = cut and scenario.draining
                yield pb.SessionResponse(verdict=verdict)
                if cut:
                    self._cut(context, scenario)
        finally:
            self._changed()

    def _refuse(self, context, record: Record, code: grpc.StatusCode, message: str):
        record.violations.append(message)
        context.abort(code, message)

    def _cut(self, context, scenario: Scenario):
        if scenario.draining:
            context.abort(grpc.StatusCode.UNAVAILABLE, DRAINING_MESSAGE)
        context.abort(grpc.StatusCode[scenario.cut_code], "scripted cut: the connection went away")

    def _verdict(self, context, scenario: Scenario, record: Record, stream: StreamState, draft: pb.Draft) -> pb.Verdict:
        drafts = list(draft.token_ids)
        if record.finish_reason and not draft.ahead:
            self._refuse(context, record, grpc.StatusCode.FAILED_PRECONDITION, f"Draft (round {draft.round}) after the finish")
        if draft.parents:
            self._refuse(context, record, grpc.StatusCode.INVALID_ARGUMENT, "a tree draft, but Info.max_tree_tokens is 0")
        if not 1 <= len(drafts) <= MAX_K or any(not 0 <= t < self.vocab_size for t in drafts):
            self._refuse(context, record, grpc.StatusCode.INVALID_ARGUMENT,
                         f"round {draft.round}: {len(drafts)} drafts (1..{MAX_K}) with ids in [0, {self.vocab_size})")
        if draft.ahead:
            holds = (not record.finish_reason and draft.round == stream.expected_round and stream.last_whole
                     and stream.last_token == draft.assumed_token)
            if not holds:
                record.discarded += 1
                return pb.Verdict(round=draft.round, discarded=True)
            record.ahead_verified += 1
        elif draft.round != stream.expected_round:
            self._refuse(context, record, grpc.StatusCode.FAILED_PRECONDITION,
                         f"Draft for round {draft.round}, expected round {stream.expected_round}")
        return self._verify(scenario, record, stream, draft.round, drafts)

    def _verify(self, scenario: Scenario, record: Record, stream: StreamState, round_no: int, drafts: list[int]) -> pb.Verdict:
        k = len(drafts)
        n = k if scenario.accept is None else min(scenario.accept, k)
        n = next((i for i, t in enumerate(drafts[:n]) if t == self.stop), n)  # the target never drafts a stop
        context = scenario.prompt + record.committed + drafts[:n]
        token = target_token(context, self.vocab_size)
        if n < k and token == drafts[n]:
            token = token % (self.vocab_size - 2) + 1  # a corrected token differs from the rejected draft
        if scenario.stop_at_round == record.rounds:
            token = self.stop
        tokens, finish = self._cut_at_budget(scenario, record, drafts[:n] + [token])
        accepted = min(n, len(tokens) - 1)
        record.committed += tokens
        record.rounds += 1
        record.next_round = round_no + 1
        stream.expected_round = round_no + 1
        stream.last_whole, stream.last_token = accepted == k, tokens[-1]
        return pb.Verdict(round=round_no, accepted=accepted, next_token=tokens[-1], finished=bool(finish),
                          finish_reason=finish, batch_size=1, verify_ms=1.0)

    def _cut_at_budget(self, scenario: Scenario, record: Record, tokens: list[int]) -> tuple[list[int], int]:
        """The round's tokens cut after the first stop token and at the budget; the finish reason."""
        finish = pb.FINISH_REASON_UNSPECIFIED
        if self.stop in tokens:
            tokens, finish = tokens[: tokens.index(self.stop) + 1], pb.FINISH_REASON_STOP_TOKEN
        left = scenario.max_new_tokens - len(record.committed)
        if len(tokens) >= left:
            tokens = tokens[:left]
            finish = finish if self.stop in tokens else pb.FINISH_REASON_LENGTH
        if finish:
            record.finish_reason = FINISH_NAMES[finish]
        return tokens, finish

    # ---- Generate ------------------------------------------------------------------------

    def Generate(self, request, context):
        scenario, record = self._begin(context, request.prompt_ids, request.first_round, request.max_new_tokens,
                                       request.stop_token_ids, request.tokenizer_fingerprint or self.fingerprint)
        stream_index, sent = record.streams, 0
        try:
            while not record.finish_reason:
                token = target_token(scenario.prompt + record.committed, self.vocab_size)
                if scenario.stop_at_round == record.rounds:
                    token = self.stop
                tokens, finish = self._cut_at_budget(scenario, record, [token])
                record.committed += tokens
                record.rounds += 1
                record.next_round += 1
                yield pb.GenerateResponse(token_ids=tokens, finished=bool(finish), finish_reason=finish, batch_size=1)
                sent += 1
                if stream_index == 1 and sent == scenario.cut_after and not finish:
                    self._cut(context, scenario)
        finally:
            self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self.report())

    def report(self) -> dict:
        with self.lock:
            return {name: asdict(record) for name, record in self.records.items()}


def serve(fingerprint: str, vocab_size: int, port: int = 0, on_change=None, transport: str = "grpc"):
    """Starts the scripted verifier on ``port`` (0: any free one) over ``transport`` ("grpc" or
    "websocket"); returns (server, verifier, port): the server has ``stop`` and ``wait_for_termination``."""
    verifier = ScriptedVerifier(fingerprint, vocab_size, on_change)
    if transport == "websocket":
        server = SocketServer(verifier, port)
        return server, verifier, server.port
    if transport != "grpc":
        raise ValueError(f"transport must be grpc or websocket, got {transport!r}")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64))  # a stream holds a thread while it lasts
    pb_grpc.add_SpeculativeServicer_to_server(verifier, server)
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server, verifier, port


# ---- the WebSocket transport (docs/protocol.md, "WebSocket transport") -----------------------------
# The same servicer, each connection on a thread of its own as each gRPC stream is: a binary frame
# is one request message, each reply one frame; ``abort`` closes with 4000 + the status code.

class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self.code, self.details = code, details


class SocketContext:
    """What the servicer calls on a gRPC context, for a WebSocket connection."""

    def abort(self, code: grpc.StatusCode, details: str):
        raise Aborted(code, details)


def _frames(connection, message_class):
    from websockets.exceptions import ConnectionClosed

    try:
        for data in connection:
            if isinstance(data, str):
                raise Aborted(grpc.StatusCode.INVALID_ARGUMENT, "a text frame: send each message as one binary frame")
            yield message_class.FromString(data)
    except ConnectionClosed:
        return


class SocketServer:
    """The scripted verifier behind ``ws://127.0.0.1:PORT`` (the websockets package's threaded server)."""

    def __init__(self, verifier: ScriptedVerifier, port: int = 0):
        from websockets.sync.server import serve as serve_websockets

        self.verifier = verifier
        self.server = serve_websockets(self._connection, "127.0.0.1", port, subprotocols=["edgespec.v1"],  # type: ignore[list-item]
                                       process_request=self._http, compression=None)
        self.port = self.server.socket.getsockname()[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _connection(self, connection) -> None:
        from websockets.exceptions import ConnectionClosed

        path = connection.request.path if connection.request is not None else ""
        try:
            if path == "/v1/session":
                replies = self.verifier.Session(_frames(connection, pb.SessionRequest), SocketContext())
            elif path == "/v1/generate":
                request = next(_frames(connection, pb.GenerateRequest), None)
                replies = self.verifier.Generate(request, SocketContext()) if request is not None else iter(())
            else:
                raise Aborted(grpc.StatusCode.NOT_FOUND, f"no route {path}: /v1/session or /v1/generate")
            for reply in replies:
                connection.send(reply.SerializeToString())
            connection.close(1000)
        except Aborted as aborted:
            connection.close(4000 + aborted.code.value[0], aborted.details.encode()[:123].decode(errors="ignore"))
        except ConnectionClosed:
            pass

    def _http(self, connection, request):
        """``GET /v1/info`` answers the InfoResponse as binary protobuf; anything else goes on to the upgrade."""
        if request.path != "/v1/info":
            return None
        from websockets.datastructures import Headers
        from websockets.http11 import Response

        body = self.verifier.Info(pb.InfoRequest(), None).SerializeToString()
        return Response(200, "OK", Headers([("Content-Type", "application/x-protobuf"), ("Content-Length", str(len(body))),
                                            ("Access-Control-Allow-Origin", "*")]), body)

    def stop(self, grace=None) -> None:
        self.server.shutdown()

    def wait_for_termination(self) -> None:
        self.thread.join()


def check(scenario: Scenario, record: dict | None, result: dict) -> list[str]:
    """Why a client failed ``scenario`` (empty: it passed). ``result``: what the client reported,
    ``{"token_ids": [...], "finish_reason": "length"}`` or ``{"error": "STATUS_CODE"}``."""
    if record is None:
        return ["the server saw no stream for this scenario"]
    failures = list(record["violations"])
    if scenario.expect_error:
        if result.get("error") != scenario.expect_error:
            failures.append(f"the client must fail with {scenario.expect_error} (no retry), reported {result}")
        return failures
    if result.get("error"):
        failures.append(f"the client failed with {result['error']}; it should have finished")
    elif result.get("token_ids") != record["committed"]:
        failures.append(f"output {result.get('token_ids')} is not what the verifier committed {record['committed']}")
    elif result.get("finish_reason") != record["finish_reason"]:
        failures.append(f"finish_reason {result.get('finish_reason')!r}, the verifier said {record['finish_reason']!r}")
    return failures


def client_request(scenario: Scenario, vocab_size: int) -> dict:
    """What a client sends for ``scenario``: the same for every port."""
    return {"scenario": scenario.name, "rpc": scenario.rpc, "prompt_ids": scenario.prompt,
            "max_new_tokens": scenario.max_new_tokens, "stop_token_ids": [vocab_size - 1], "mode": "greedy",
            "k": K, "send_ahead": scenario.send_ahead, "expect": scenario.expect_error or "finish", "what": scenario.what}


# ---- the Python SDK against every scenario ---------------------------------------------------------


def run_sdk(draft_dir: str) -> dict[str, list[str]]:
    """Runs the Python SDK through every scenario; returns each scenario's failures."""
    from edgespec.edge.client import EdgeClient
    from edgespec.edge.draft import DraftModel
    from edgespec.edge.errors import EdgespecError

    draft = DraftModel(draft_dir)
    server, verifier, port = serve(draft.manifest.tokenizer_fingerprint, draft.vocab_size)
    failures = {}
    try:
        with EdgeClient(f"127.0.0.1:{port}", draft, timeout=10, max_retries=2) as client:
            for scenario in SCENARIOS:
                request = client_request(scenario, draft.vocab_size)
                params = dict(max_new_tokens=request["max_new_tokens"], stop_token_ids=request["stop_token_ids"])
                try:
                    if scenario.rpc == "Generate":
                        result = client.generate_cloud(scenario.prompt, **params)
                    else:
                        result = client.generate(scenario.prompt, k=K, speculate=True, send_ahead=scenario.send_ahead, **params)
                    reported = {"token_ids": result.token_ids, "finish_reason": result.finish_reason}
                except EdgespecError as exc:
                    reported = {"error": exc.code.name if getattr(exc, "code", None) is not None else type(exc).__name__}
                failures[scenario.name] = check(scenario, verifier.report().get(scenario.name), reported)
    finally:
        server.stop(grace=None)
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("list", help="the scenarios, as the requests a client makes (JSON lines)")
    listing.add_argument("--vocab-size", type=int, default=256)
    serving = commands.add_parser("serve", help="play every scenario until interrupted")
    serving.add_argument("--port", type=int, default=50070)
    serving.add_argument("--fingerprint", required=True, help="the client's tokenizer fingerprint (Info says it)")
    serving.add_argument("--vocab-size", type=int, required=True)
    serving.add_argument("--report", default="scripted-report.json", help="rewritten after every stream")
    serving.add_argument("--transport", choices=("grpc", "websocket"), default="grpc",
                         help="gRPC on PORT, or WebSocket: ws://127.0.0.1:PORT/v1/session, /v1/generate, GET /v1/info")
    checking = commands.add_parser("check", help="judge a client's results against the server's report")
    checking.add_argument("--report", required=True)
    checking.add_argument("--results", required=True, help='JSON lines: {"scenario", "token_ids", "finish_reason"} or {"scenario", "error"}')
    sdk = commands.add_parser("sdk", help="run the Python SDK through every scenario")
    sdk.add_argument("--draft", required=True, help="an exported draft directory (its fingerprint and vocabulary are used)")
    args = parser.parse_args(argv)
    if args.command == "list":
        for scenario in SCENARIOS:
            print(json.dumps(client_request(scenario, args.vocab_size)))
        return 0
    if args.command == "serve":
        def write(report):
            with open(args.report, "w") as f:
                json.dump(report, f, indent=1)
        server, _, port = serve(args.fingerprint, args.vocab_size, args.port, on_change=write, transport=args.transport)
        where = f"ws://127.0.0.1:{port}/v1/session" if args.transport == "websocket" else f"127.0.0.1:{port}"
        print(f"scripted verifier on {where}; report: {args.report}", flush=True)
        server.wait_for_termination()
        return 0
    if args.command == "check":
        report = json.load(open(args.report))
        lines = [json.loads(line) for line in open(args.results) if line.strip()]
        results = {line["scenario"]: line for line in lines}
        failures = {s.name: check(s, report.get(s.name), results.get(s.name, {"error": "NOT_RUN"})) for s in SCENARIOS}
    else:
        failures = run_sdk(args.draft)
    for name, why in failures.items():
        print(f"{'PASS' if not why else 'FAIL'}  {name}" + "".join(f"\n      {w}" for w in why))
    return 1 if any(failures.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
