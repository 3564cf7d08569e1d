"""The Ray Serve deployment behind Serve's gRPC ingress: Session, Generate, Info, Health, reflection.

Each stream handler authenticates the caller (``auth.py``) before it reads a message,
validates its messages on the event loop and submits them to the ``BatchScheduler``
(``scheduler.py``, and why not ``@serve.batch``): the drafts of every session waiting for a
verdict are verified together in ONE target forward. The model runs on one model thread
(``model_thread.py``; optionally in an engine process, ``backend.py``), so the event loop keeps
receiving messages (and filling the next batch) while it computes; a prompt is prefilled in
chunks of one forward each, between which other sessions' batches run.

A replica that Serve stops (scale-down, redeploy) drains without losing a token
(``drain.py``): each session's next verdict says ``draining`` and the stream then ends with
UNAVAILABLE, new sessions are refused with UNAVAILABLE, and devices reopen elsewhere at once.

No client can wedge the replica: a stream must send its Open within
``first_message_timeout_s`` and then a message every ``session_idle_timeout_s``; streams still
waiting for their Open are bounded per key (one more is refused at once) and per replica (the
oldest is shed), ``PendingOpens``, so silent ones never hold the request slots sessions need; admission
(``admission.py``) bounds sessions, KV bytes and each key's share; messages over the cap or
not valid protobuf are refused by value (``servicers.py``); a row that fails fails only its
session; the health check fails when the model thread is stuck.

Errors: a refused request ends its own stream with a precise gRPC status code and a message
that says what to fix (a ``ServerError``); other sessions on the replica are untouched. A
client that goes away is no error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from typing import Any, AsyncIterator, Callable

import grpc
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha._async import ReflectionServicer
from ray import serve

from edgespec.cloud.serving import codec
from edgespec.cloud.serving.admission import Admission, PendingOpens, shed_error
from edgespec.cloud.serving.cpu_ledger import CpuLedger
from edgespec.cloud.serving.auth import ApiKey, KeyRing, is_loopback_peer
from edgespec.cloud.serving.drain import DrainWatch, draining_error, is_draining_error
from edgespec.cloud.serving.steptime import StepTime
from edgespec.cloud.serving.config import VerifierConfig
from edgespec.cloud.serving.metrics import VerifierMetrics
from edgespec.cloud.serving.model_thread import ModelThread
from edgespec.cloud.serving.scheduler import BatchScheduler
from edgespec.cloud.serving.servicers import (
    HEALTH_SERVICE,
    REFLECTION_SERVICES,
    SPECULATIVE_SERVICE,
    Malformed,
    message_cap,
    set_message_cap,
)
from edgespec.cloud.serving.session import SessionState, check_draft, discarded, invalid, precondition
from edgespec.cloud.serving.verifier import Verifier, VerifyItem
from edgespec.edge import __version__
from edgespec.edge.errors import ServerError, status_error
from edgespec.edge.params import Finish
from edgespec.v1 import speculative_pb2 as pb

log = logging.getLogger("ray.serve")

DEPLOYMENT_NAME = "Verifier"
RECONNECT = "reopen with the committed tokens to continue"


def resident_bytes() -> int:
    """This process's resident memory (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _client_gone(exc: BaseException) -> bool:
    """The stream ended because the client went away (a normal end after Close, or a cancel)."""
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
        return True
    return type(exc).__name__ in ("TaskCancelledError", "RequestCancelledError")


def _replica_id() -> str:
    """Serve's id of this replica ("" outside Serve)."""
    try:
        return serve.get_replica_context().replica_tag
    except Exception:
        return ""


def _checked(message, what: str):
    """The message, or the status for a request that was not one (see servicers.py)."""
    if isinstance(message, Malformed):
        code = grpc.StatusCode.RESOURCE_EXHAUSTED if message.too_large else grpc.StatusCode.INVALID_ARGUMENT
        raise status_error(code, f"{what}: {message.reason}; send a well-formed {message.message_type}")
    return message


async def _one(message):
    """A unary call's request as a request stream (``generate`` reads its first message)."""
    yield message


def _returning_session(item: VerifyItem) -> int | None:
    """The scheduler's name for an item's session: its state's id (forgotten at release); None
    for a Generate step, whose next step follows at once: never tracked, always waited for."""
    return id(item.state) if item.block is not None else None


@serve.deployment(name=DEPLOYMENT_NAME)
class VerifierDeployment:
    def __init__(self, config: dict[str, Any]):
        self.config = VerifierConfig.from_dict(config)
        self.keys = KeyRing(self.config.api_keys_file, self.config.api_keys_env)
        self.verifier = Verifier(self.config)
        limits = self.verifier.limits
        set_message_cap(self.config.message_cap(limits.max_context))
        self.model = ModelThread()
        info = self.verifier.backend.info
        self.admission = Admission(max_sessions=self.config.max_sessions, max_kv_bytes=info.kv_pool_bytes,
                                   kv_bytes_per_token=info.kv_bytes_per_token, page_tokens=info.kv_page_tokens,
                                   round_tokens=self.config.round_tokens)
        self.pending = PendingOpens(max_streams=self.config.max_pending_streams,
                                    max_per_key=self.config.max_pending_streams_per_key)
        if self.keys.enabled:
            from edgespec.cloud.serving.fleet_quota import FleetQuota

            # tokens_per_minute across every replica (a shared actor), the per-replica count kept as the guard
            self.admission.quotas.fleet = FleetQuota()
        self.metrics = VerifierMetrics()
        self.forward_ms = StepTime()  # forward + accept of verification batches, reported by Info
        self.decode_ms = StepTime()  # the same for batches of Generate decoding steps alone
        self.stream_ms = StepTime()  # a Generate stream's interval per token, reply to reply (step, scheduling, sending)
        self.batches = BatchScheduler(
            lambda items: self.model.run(self._step, items),
            max_batch_size=self.config.max_batch_size,
            wait_s=self.config.batch_wait_timeout_s,
            expected=lambda: self.admission.active,
            on_batch=self._on_batch,
            session=_returning_session if self.config.batch_wait_for == "returning" else None,
        )
        self.drain = DrainWatch()
        self.replica_id = _replica_id()
        self._reflection = ReflectionServicer([SPECULATIVE_SERVICE, HEALTH_SERVICE, *REFLECTION_SERVICES])
        self.ledger = CpuLedger()  # bench overhead's; its hook wraps the methods it times, none when off
        if self.config.profile_cpu:
            self.ledger.install(self)
        auth = f"{self.keys.count} API key(s)" if self.keys.enabled else "NO API keys (loopback only)"
        log.info("edgespec verifier ready (%s): %s", auth, self.verifier.backend.info.description)

    # ---- the speculative session -------------------------------------------------------

    async def Session(self, requests: AsyncIterator[pb.SessionRequest], grpc_context=None):
        """The session over gRPC: ``session``'s refusal becomes the stream's status."""
        try:
            async for response in self.session(requests, lambda: self._authenticate(grpc_context)):
                yield response
        except ServerError as exc:
            raise self._fail(grpc_context, exc.code, exc.details) from None

    async def session(self, requests: AsyncIterator, authenticate: Callable[[], ApiKey | None]):
        """One speculative session, whatever carries it (gRPC above, WebSocket in websocket.py).

        ``requests``: the client's messages, each a SessionRequest or the ``Malformed`` its bytes
        were (servicers.py); ``authenticate``: the caller's key, raising before any message is read.
        Yields SessionResponses. Ends when the client closes its side or after Close; every refusal
        leaves as the ServerError its client receives; a client that goes away is no error.
        """
        session: SessionState | None = None
        session_id, key = "", None
        try:
            key = authenticate()
            while True:
                request = await self._next_message(requests, first=session is None, key=key)
                if request is None:
                    break
                request, kind = self._read_request(request)
                if kind == "open":
                    if session is not None:
                        raise precondition("Open sent twice on one stream: open a new stream for a new session")
                    session = await self._admit(codec.open_from_proto(request.open), key)
                    session_id = uuid.uuid4().hex
                    yield codec.opened_to_proto(session_id, max_k=self.config.max_k, max_context=self.verifier.limits.max_context,
                                                max_new_tokens=session.max_new_tokens, model_id=self.config.model_id,
                                                replica_id=self.replica_id)
                elif kind == "draft":
                    if session is None:
                        raise precondition("Draft before Open: the first message of a session must be Open")
                    verdict = await self._round(session, request.draft)
                    response, moving = self._encode_verdict(verdict)
                    yield response
                    if moving:
                        raise draining_error()
                elif kind == "close":
                    if session is not None:
                        closed = codec.closed_to_proto(session.next_round - session.spec.first_round, session.generated)
                        # Free the slot before Closed leaves (as Generate does before its last
                        # token): a device that opens its next session the moment it reads
                        # Closed must find the slot free. A full replica refused 16 sessions
                        # opened right after 16 had closed, the generator not yet resumed.
                        self._release(session)
                        session = None
                        yield closed
                    break
                else:
                    raise invalid("empty SessionRequest: set open, draft or close")
        except Exception as exc:
            if _client_gone(exc):
                raise
            raise self._refusal(exc, f"session {session_id}", key) from None
        finally:
            if session is not None:
                self._release(session)

    async def _round(self, session: SessionState, draft: pb.Draft):
        message, last, last_block = self._read_draft(draft), session.last_verdict, session.last_block
        if (not message.ahead and last is not None and last_block is not None and message.round_no == last.round_no
                and message.tokens == last_block.tokens):
            return last  # a retried round: same drafts, same (already committed) verdict
        block = self._validate(session, message)
        if block is None:  # sent ahead on an assumption that failed: no forward
            self.metrics.discarded_block()
            return discarded(message.round_no)
        self.admission.quotas.check_tokens(session.key)
        verdict = await self._verify(VerifyItem(session, block))
        self.admission.quotas.charge(session.key, verdict.emitted)
        return verdict

    async def _verify(self, item: VerifyItem):
        """A round's verdict: from the next batched forward, or, on a backend that batches by
        itself (vLLM), from its own request."""
        if not self.verifier.continuous:
            return await self.batches.submit(item)
        verdict = await self.verifier.verify_now(item)
        self._on_batch([item], [verdict])
        return verdict

    async def _decode_steps(self, session: SessionState):
        """Generate's verdicts, a token each: scheduled decoding steps, or the engine's own stream."""
        if self.verifier.continuous:
            async for verdict in self.verifier.decode_stream(session):
                self._on_batch([VerifyItem(session, None)], [verdict])
                yield verdict
            return
        while True:
            yield await self.batches.submit(VerifyItem(session, None))

    # The synchronous phases of a round, apart so that cpu_ledger.py can time them.

    def _read_request(self, request) -> tuple[pb.SessionRequest, str | None]:
        request = _checked(request, "SessionRequest")
        return request, request.WhichOneof("kind")

    def _read_draft(self, draft: pb.Draft) -> codec.DraftMessage:
        return codec.draft_from_proto(draft, self.config.max_q_entries)

    def _validate(self, session: SessionState, message: codec.DraftMessage):
        """The draft's block (None: sent ahead on an assumption that failed)."""
        return check_draft(session, message.round_no, message.tokens, message.q, ahead=message.ahead,
                           assumed_token=message.assumed_token, parents=message.parents)

    def _encode_verdict(self, verdict) -> tuple[pb.SessionResponse, bool]:
        """The verdict's message, and whether it tells the session to move (``_moving``)."""
        response = codec.verdict_to_proto(verdict)
        moving = self._moving(response.verdict.finished or response.verdict.discarded, generate=False)
        response.verdict.draining = moving
        return response, moving

    def _step(self, items):
        """One batch on the model thread (``Verifier.step``; profiling splits its CPU into forward and bookkeeping)."""
        return self.verifier.step(items)

    def cpu_stats(self) -> dict:
        """The replica's CPU ledger (``cpu_ledger.py``): read through a Serve handle by ``bench overhead``."""
        return self.ledger.snapshot()

    def gather_stats(self) -> dict:
        """How long forwards waited for more sessions (``scheduler.GatherStats``), through a Serve handle."""
        return self.batches.stats.to_dict() | {"batch_wait_for": self.config.batch_wait_for}

    async def _next_message(self, requests: AsyncIterator, *, first: bool, key: ApiKey | None = None,
                            expecting: str = "Open"):
        """The stream's next message; the first one within first_message_timeout_s, holding one of
        the places of streams waiting for their first message (``PendingOpens``: refused at once
        over its key's bound; over the replica's, the oldest waiting stream is shed)."""
        timeout = self.config.first_message_timeout_s if first else self.config.session_idle_timeout_s
        place = None
        try:
            with self.pending.waiting(key) if first else contextlib.nullcontext() as place:
                # NOTE: Python 3.11+ (the verifier's floor; the device SDK's is 3.10): an
                # asyncio.Timeout, unlike wait_for, can be moved to now when the place is shed.
                async with asyncio.timeout(timeout) as deadline:  # pyright: ignore[reportAttributeAccessIssue]
                    if place is not None:
                        place.deadline = deadline  # shedding it for a newer stream moves this to now
                    return await requests.__anext__()
        except StopAsyncIteration:
            return None
        except TimeoutError:
            if place is not None and place.shed:
                raise shed_error(self.pending.max_streams) from None
            session = expecting == "Open"
            what = f"no {expecting} within" if first else f"{'session' if session else 'stream'} idle for more than"
            then = RECONNECT if session else "open a new stream and send at once"
            raise status_error(grpc.StatusCode.DEADLINE_EXCEEDED, f"{what} {timeout:g}s: closed; {then}") from None

    def _moving(self, finished: bool, *, generate: bool) -> bool:
        """Whether this answer tells its session to move: the replica drains and the session
        would go on (a finished one just ends)."""
        if finished or not self.drain.draining:
            return False
        self.metrics.session_moved(generate)
        return True

    async def _admit(self, request, key: ApiKey | None, *, generate: bool = False) -> SessionState:
        """Validates, takes the session's share of the replica, prefills the prompt chunk by chunk."""
        if self.drain.draining:  # the ingress is taking this replica out; the device opens again elsewhere
            raise draining_error()
        state = self.verifier.admit(request, generate=generate)
        self.admission.acquire(state, key)
        try:
            if self.verifier.continuous:
                await self.verifier.open_now(state)
            else:
                for job in self.verifier.prefill_jobs(state):
                    await self.model.run(job)
        except BaseException:
            # Cancelled mid-prefill (or failed): the cache is freed after the job in flight.
            self._release(state)
            raise
        self.metrics.session_opened(generate, self.admission.active, key.key_id if key else "")
        return state

    def _release(self, session: SessionState) -> None:
        self.admission.release(session)
        self.batches.forget(id(session))
        self.model.submit(self.verifier.finish, session)  # frees the session's KV cache
        self.metrics.session_closed(self.admission.active)

    # ---- cloud-only generation (the baseline) --------------------------------------------

    async def Generate(self, request: pb.GenerateRequest, grpc_context=None):
        """Generate over gRPC: ``generate``'s refusal becomes the stream's status."""
        try:
            async for reply in self.generate(_one(request), lambda: self._authenticate(grpc_context)):
                yield reply
        except ServerError as exc:
            raise self._fail(grpc_context, exc.code, exc.details) from None

    async def generate(self, requests: AsyncIterator, authenticate: Callable[[], ApiKey | None]):
        """Cloud-only generation, whatever carries it: the first of ``requests`` (a GenerateRequest,
        or its ``Malformed``; within the first-message deadline) is answered a token a message.
        Refusals leave as ServerErrors, as ``session``'s do."""
        session: SessionState | None = None
        key, released, steps = None, False, None
        try:
            key = authenticate()
            request = await self._next_message(requests, first=True, key=key, expecting="GenerateRequest")
            if request is None:
                raise invalid("no GenerateRequest: send one, then read the tokens")
            request = _checked(request, "GenerateRequest")
            session = await self._admit(codec.generate_from_proto(request), key, generate=True)
            steps = self._decode_steps(session)
            last_reply = None
            while not session.finished:
                self.admission.quotas.check_tokens(key)
                verdict = await anext(steps)
                last_reply = self._stream_interval(last_reply, verdict)
                self.admission.quotas.charge(key, verdict.emitted)
                moving = self._moving(verdict.finish is not Finish.NONE, generate=True)
                if session.finished and not moving:
                    # Free the slot before the last token leaves: a device that opens its next
                    # request the moment this one ends must find it free (a key limited to one
                    # session was refused "1 open sessions" when it raced the generator's end).
                    self._release(session)
                    released = True
                yield codec.generate_reply_to_proto(verdict, draining=moving)
                if moving:
                    raise draining_error()
        except Exception as exc:
            if _client_gone(exc):
                raise
            raise self._refusal(exc, "generate", key) from None
        finally:
            if steps is not None:
                await steps.aclose()
            if session is not None and not released:
                self._release(session)

    def _stream_interval(self, last_reply: float | None, verdict) -> float:
        """Records the stream's time per token since its previous reply (after the first: the
        prefill is not a decoding interval); returns now, the next interval's start."""
        now = time.monotonic()
        if last_reply is not None and verdict.emitted:
            self.stream_ms.add((now - last_reply) * 1000 / verdict.emitted, verdict.batch_size, now)
        return now

    # ---- unary calls ---------------------------------------------------------------------

    async def Info(self, request: pb.InfoRequest, grpc_context=None) -> pb.InfoResponse:
        """Info over gRPC (``info``)."""
        try:
            _checked(request, "InfoRequest")
            key = self._authenticate(grpc_context, required=False)
        except ServerError as exc:
            raise self._status(grpc_context, exc, "info") from None
        return self.info(key)

    def info(self, key: ApiKey | None) -> pb.InfoResponse:
        """What every client needs; the replica's own diagnostics only to a caller with a key
        (or to any caller of a verifier without keys)."""
        diagnostics = None
        if key is not None or not self.keys.enabled:
            info = self.verifier.backend.info
            diagnostics = codec.ReplicaDiagnostics(info.params, info.kv_bytes_per_token, resident_bytes(), self.admission.active,
                                                   self.admission.free_sessions, self.replica_id)
        return codec.info_to_proto(self.verifier.limits, self.config, version=__version__, forward_ms=self.forward_ms.value(),
                                   decode_ms=self.decode_ms.value(), stream_ms=self.stream_ms.value(),
                                   max_message_bytes=message_cap(),
                                   auth_required=self.keys.enabled, diagnostics=diagnostics)

    def __serve_build_asgi_app__(self):
        """The replica's HTTP routes behind Serve's HTTP ingress (``app.py`` makes the deployment an
        ASGI ingress): Session and Generate over WebSocket and Info, through the same code as over gRPC."""
        from edgespec.cloud.serving.websocket import build_asgi_app

        return build_asgi_app(session=self.session, generate=self.generate, info=self.info, authenticate=self._authenticate,
                              allowed_origins=self.config.allowed_origins)

    async def Check(self, request, grpc_context=None) -> health_pb2.HealthCheckResponse:
        if isinstance(request, Malformed):
            raise self._fail(grpc_context, grpc.StatusCode.INVALID_ARGUMENT, f"HealthCheckRequest: {request.reason}")
        known = ("", SPECULATIVE_SERVICE)
        if request.service not in known:
            raise self._fail(grpc_context, grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}; known: {known}")
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    # (the List messages are newer than grpcio-health-checking's type stubs, as in servicers.py)
    async def List(self, request, grpc_context=None) -> health_pb2.HealthListResponse:  # pyright: ignore[reportAttributeAccessIssue]
        serving = health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)
        return health_pb2.HealthListResponse(statuses={"": serving, SPECULATIVE_SERVICE: serving})  # pyright: ignore[reportAttributeAccessIssue]

    async def Watch(self, request, grpc_context=None):
        # A replica that answers is serving; the stream ends rather than hold a request slot.
        yield await self.Check(request, grpc_context)

    async def ServerReflectionInfo(self, requests, grpc_context=None):
        """Server reflection, v1 and v1alpha (the same messages on the wire), behind the API key."""
        try:
            key = self._authenticate(grpc_context)
        except ServerError as exc:
            raise self._status(grpc_context, exc, "reflection") from None

        async def checked():
            # The same deadlines and bound on silent streams as a session's (a silent stream holds a request slot).
            first = True
            while (request := await self._next_message(requests, first=first, key=key, expecting="request")) is not None:
                first = False
                if isinstance(request, Malformed):
                    raise self._fail(grpc_context, grpc.StatusCode.INVALID_ARGUMENT, f"ServerReflectionRequest: {request.reason}")
                yield request

        try:
            # (an async generator; typeshed's grpcio-reflection stub declares it a coroutine)
            async for response in self._reflection.ServerReflectionInfo(checked(), grpc_context):  # pyright: ignore[reportGeneralTypeIssues]
                yield response
        except ServerError as exc:
            raise self._status(grpc_context, exc, "reflection", key) from None

    def check_health(self) -> None:
        """Serve restarts a replica whose engine died or whose model thread is stuck."""
        if not getattr(self.verifier.backend, "alive", True):
            raise RuntimeError("the engine process is not running")
        busy = self.model.busy_for()
        if busy > self.config.model_stuck_s:
            raise RuntimeError(f"the model thread has been running one job for {busy:.0f}s (limit {self.config.model_stuck_s:g}s)")

    def __del__(self) -> None:
        verifier = getattr(self, "verifier", None)
        if verifier is not None:
            verifier.shutdown()

    # ---- helpers ---------------------------------------------------------------------------

    def _authenticate(self, grpc_context, *, required: bool = True) -> ApiKey | None:
        """The caller's key (None without keys configured); UNAUTHENTICATED before any work.
        ``grpc_context``: a gRPC call's, or the ``websocket.Caller`` of an HTTP request."""
        if not self.keys.enabled:
            if grpc_context is not None and not self.config.allow_unauthenticated and not is_loopback_peer(grpc_context.peer()):
                raise status_error(grpc.StatusCode.PERMISSION_DENIED, (
                    f"this verifier has no API keys and serves callers on its own machine only (you are {grpc_context.peer()}); "
                    "its operator must configure api_keys_file/api_keys_env or set allow_unauthenticated"))
            return None
        metadata = grpc_context.invocation_metadata() if grpc_context is not None else ()
        if not required and not any(name.lower() in ("authorization", "x-api-key") for name, _ in metadata or ()):
            return None
        return self.keys.authenticate(metadata)

    def _on_batch(self, items, verdicts) -> None:
        done = [(item, verdict) for item, verdict in zip(items, verdicts) if not isinstance(verdict, BaseException)]
        if not done:
            return
        ms = done[0][1].verify_ms
        decoding = all(item.block is None for item, _ in done)  # Generate streams' decoding steps only
        (self.decode_ms if decoding else self.forward_ms).add(ms, len(items))
        self.metrics.record_batch([item for item, _ in done], [verdict for _, verdict in done])

    def _status(self, grpc_context, exc: Exception, what: str, key: ApiKey | None = None) -> Exception:
        """Turns an exception of a stream into the status its client receives (``_refusal``)."""
        refusal = self._refusal(exc, what, key)
        return self._fail(grpc_context, refusal.code, refusal.details)

    def _refusal(self, exc: Exception, what: str, key: ApiKey | None = None) -> ServerError:
        """What a client is told when its request ends in ``exc``, counted in the error metric.

        A ServerError is the client's to fix and keeps its code; anything else is ours
        (INTERNAL, logged with its traceback).
        """
        if is_draining_error(exc):  # a move, not a failure: no error in the metric
            return exc
        if not isinstance(exc, ServerError):
            log.exception("%s failed", what)
            exc = status_error(grpc.StatusCode.INTERNAL, f"verifier error: {exc!r}; {RECONNECT}")
        self.metrics.error(exc.code, key.key_id if key else "")
        return exc

    @staticmethod
    def _fail(grpc_context, code: grpc.StatusCode, message: str) -> Exception:
        """Sets the status the ingress answers with; returns the exception to raise.

        NOTE: with the proxy ingress the exception crosses to the proxy process by pickling, so
        it is a builtin type: a custom class with a different constructor fails to deserialize.
        """
        if grpc_context is not None:
            grpc_context.set_code(code)
            grpc_context.set_details(message)
        return RuntimeError(message)


def ingress_deployment():
    """The deployment Serve runs: ``VerifierDeployment`` as Serve's ASGI ingress too, so its replicas
    serve the WebSocket session route and Info beside the gRPC methods (``__serve_build_asgi_app__``).
    Wrapped here rather than by decorating the class: ``serve.ingress`` makes ``__init__`` async,
    and the class is also driven directly, without Serve."""
    return serve.deployment(name=DEPLOYMENT_NAME)(serve.ingress()(VerifierDeployment.func_or_class))
