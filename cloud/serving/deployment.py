"""The Ray Serve deployment behind Serve's gRPC proxy: Session, Generate, Info, Health.

Each stream handler validates its messages on the event loop and submits them to the
``BatchScheduler`` (``scheduler.py``, and why not ``@serve.batch``): the drafts of every
session waiting for a verdict are verified together in ONE target forward. The model runs on a
single model thread (optionally in an engine process, ``backend.py``), so the event loop keeps
receiving messages (and filling the next batch) while it computes.

Errors: a refused request ends its own stream with a precise gRPC status code and a message
that says what to fix (a ``ServerError``); other sessions on the replica are untouched.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator

import grpc
from grpc_health.v1 import health_pb2
from ray import serve

from edgespec.edge import __version__
from edgespec.cloud.serving import codec
from edgespec.cloud.serving.config import VerifierConfig
from edgespec.cloud.serving.metrics import VerifierMetrics
from edgespec.cloud.serving.scheduler import BatchScheduler
from edgespec.cloud.serving.session import SessionState, check_draft, discarded, invalid, precondition
from edgespec.cloud.serving.verifier import Verifier, VerifyItem
from edgespec.edge.errors import ServerError, status_error
from edgespec.edge.params import Finish
from edgespec.edge.wire import FINISH_TO_WIRE
from edgespec.v1 import speculative_pb2 as pb

log = logging.getLogger("ray.serve")


def resident_bytes() -> int:
    """This process's resident memory (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


DEPLOYMENT_NAME = "Verifier"


@serve.deployment(name=DEPLOYMENT_NAME)
class VerifierDeployment:
    def __init__(self, config: dict[str, Any]):
        self.config = VerifierConfig.from_dict(config)
        self.verifier = Verifier(self.config)
        # One thread owns the model: forwards never overlap, and the event loop stays free.
        self._model_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edgespec-model")
        self.active_sessions = 0
        self.metrics = VerifierMetrics()
        self.forward_ms = 0.0  # exponentially weighted forward + accept time, reported by Info
        self.batches = BatchScheduler(
            lambda items: self._on_model_thread(self.verifier.step, items),
            max_batch_size=self.config.max_batch_size,
            wait_s=self.config.batch_wait_timeout_s,
            expected=lambda: self.active_sessions,
            on_batch=self._on_batch,
        )
        log.info("edgespec verifier ready: %s", self.verifier.backend.info.description)

    # ---- the speculative session -------------------------------------------------------

    async def Session(self, requests: AsyncIterator[pb.SessionRequest], grpc_context=None):
        session: SessionState | None = None
        session_id = ""
        try:
            while True:
                request = await self._next_message(requests)
                if request is None:
                    break
                kind = request.WhichOneof("kind")
                if kind == "open":
                    if session is not None:
                        raise precondition("Open sent twice on one stream: open a new stream for a new session")
                    session = await self._admit(codec.open_from_proto(request.open))
                    session_id = uuid.uuid4().hex
                    yield pb.SessionResponse(
                        opened=pb.Opened(
                            session_id=session_id,
                            max_k=self.config.max_k,
                            max_context=self.verifier.limits.max_context,
                            max_new_tokens=session.max_new_tokens,
                            model_id=self.config.model_id,
                        )
                    )
                elif kind == "draft":
                    if session is None:
                        raise precondition("Draft before Open: the first message of a session must be Open")
                    yield codec.verdict_to_proto(await self._round(session, request.draft))
                elif kind == "close":
                    if session is not None:
                        yield pb.SessionResponse(
                            closed=pb.Closed(rounds=session.next_round - session.spec.first_round, generated_tokens=session.generated)
                        )
                    break
                else:
                    raise invalid("empty SessionRequest: set open, draft or close")
        except Exception as exc:
            raise self._status(grpc_context, exc, f"session {session_id}") from None
        finally:
            if session is not None:
                self._release(session)

    async def _round(self, session: SessionState, draft: pb.Draft):
        last = session.last_verdict
        tokens = list(draft.token_ids)
        if not draft.ahead and last is not None and draft.round == last.round_no and tokens == session.last_block.tokens:
            return last  # a retried round: same drafts, same (already committed) verdict
        block = check_draft(session, int(draft.round), tokens, codec.draft_q(draft), ahead=draft.ahead,
                            assumed_token=int(draft.assumed_token), parents=list(draft.parents))
        if block is None:  # sent ahead on an assumption that failed: no forward
            self.metrics.discarded_block()
            return discarded(int(draft.round))
        return await self.batches.submit(VerifyItem(session, block))

    async def _next_message(self, requests: AsyncIterator[pb.SessionRequest]) -> pb.SessionRequest | None:
        try:
            return await asyncio.wait_for(requests.__anext__(), timeout=self.config.session_idle_timeout_s)
        except StopAsyncIteration:
            return None
        except asyncio.TimeoutError:
            raise status_error(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"session idle for more than {self.config.session_idle_timeout_s:g}s: closed; "
                "reopen with the committed tokens to continue",
            ) from None

    async def _admit(self, request, *, generate: bool = False) -> SessionState:
        """Takes a session slot and prefills the prompt; refuses when the replica is full."""
        if self.active_sessions >= self.config.max_sessions:
            raise status_error(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"replica at capacity ({self.config.max_sessions} sessions): retry later or add replicas",
            )
        self.active_sessions += 1
        try:
            session = await self._on_model_thread(self.verifier.start, request, generate=generate)
        except BaseException:
            self.active_sessions -= 1
            raise
        self.metrics.session_opened(generate, self.active_sessions)
        return session

    def _release(self, session: SessionState) -> None:
        self.active_sessions -= 1
        self._model_thread.submit(self.verifier.finish, session)  # frees the session's KV cache
        self.metrics.session_closed(self.active_sessions)

    # ---- cloud-only generation (the baseline) --------------------------------------------

    async def Generate(self, request: pb.GenerateRequest, grpc_context=None):
        session: SessionState | None = None
        try:
            session = await self._admit(codec.generate_from_proto(request), generate=True)
            while not session.finished:
                verdict = await self.batches.submit(VerifyItem(session, None))
                yield pb.GenerateResponse(
                    token_ids=[verdict.next_token],
                    finished=verdict.finish is not Finish.NONE,
                    finish_reason=FINISH_TO_WIRE[verdict.finish],
                )
        except Exception as exc:
            raise self._status(grpc_context, exc, "generate") from None
        finally:
            if session is not None:
                self._release(session)

    # ---- unary calls ---------------------------------------------------------------------

    async def Info(self, request: pb.InfoRequest, grpc_context=None) -> pb.InfoResponse:
        limits = self.verifier.limits
        return pb.InfoResponse(
            model_id=self.config.model_id,
            tokenizer_fingerprint=limits.tokenizer_fingerprint,
            vocab_size=limits.vocab_size,
            max_context=limits.max_context,
            max_k=limits.max_k,
            modes=codec.SERVED_MODES,
            max_new_tokens=limits.max_new_tokens,
            version=__version__,
            target_params=self.verifier.backend.info.params,
            kv_bytes_per_token=self.verifier.backend.info.kv_bytes_per_token,
            replica_rss_bytes=resident_bytes(),
            active_sessions=self.active_sessions,
            forward_ms=self.forward_ms,
            send_ahead=True,
            max_tree_tokens=limits.max_tree_tokens,
        )

    async def Check(self, request: health_pb2.HealthCheckRequest, grpc_context=None) -> health_pb2.HealthCheckResponse:
        known = ("", "edgespec.v1.Speculative")
        if request.service not in known:
            raise self._fail(grpc_context, grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}; known: {known}")
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    async def Watch(self, request: health_pb2.HealthCheckRequest, grpc_context=None):
        # A replica that answers is serving; the stream ends rather than hold a request slot.
        yield await self.Check(request, grpc_context)

    def check_health(self) -> None:
        """Serve restarts a replica whose engine process died (e.g. killed for memory)."""
        alive = getattr(self.verifier.backend, "alive", True)
        if not alive:
            raise RuntimeError("the engine process is not running")

    def __del__(self) -> None:
        verifier = getattr(self, "verifier", None)
        if verifier is not None:
            verifier.shutdown()

    # ---- batching --------------------------------------------------------------------------

    def _on_batch(self, items, verdicts) -> None:
        ms = verdicts[0].verify_ms
        self.forward_ms = ms if not self.forward_ms else 0.9 * self.forward_ms + 0.1 * ms
        self.metrics.record_batch(items, verdicts)

    async def _on_model_thread(self, fn, *args, **kwargs):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._model_thread, lambda: fn(*args, **kwargs))

    def _status(self, grpc_context, exc: Exception, what: str) -> Exception:
        """Turns an exception of a stream into the status its client receives.

        A ServerError is the client's to fix and keeps its code; anything else is ours
        (INTERNAL, logged with its traceback). Cancellation is a BaseException and passes.
        """
        if isinstance(exc, ServerError):
            code, message = exc.code, exc.details
        else:
            log.exception("%s failed", what)
            code, message = grpc.StatusCode.INTERNAL, f"verifier error: {exc!r}; reopen the session to continue"
        self.metrics.error(code)
        return self._fail(grpc_context, code, message)

    @staticmethod
    def _fail(grpc_context, code: grpc.StatusCode, message: str) -> Exception:
        """Sets the status the proxy answers with; returns the exception to raise.

        NOTE: the exception crosses to the proxy process by pickling, so it is a builtin
        type: a custom class with a different constructor fails to deserialize there.
        """
        if grpc_context is not None:
            grpc_context.set_code(code)
            grpc_context.set_details(message)
        return RuntimeError(message)
