"""The asyncio client: ``async with AsyncEdgeClient(server, draft) as c: await c.generate(...)``.

It owns one gRPC channel and one draft model. The draft runs on a private thread, so an
application's event loop is never blocked by drafting. Concurrent generations on one client
each get a fork of the draft (own context and KV cache, shared weights); their drafting takes
turns on the draft thread.
"""

from __future__ import annotations

import asyncio
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Sequence

import grpc

from edgespec.edge.detok import IncrementalDecoder
from edgespec.edge.draft import DraftModel
from edgespec.edge.eos import chat_template_of
from edgespec.edge.driver import Clock, Generation
from edgespec.edge.errors import EdgespecError, TokenizerMismatchError
from edgespec.edge.openai_request import render_chat
from edgespec.edge.params import GenerationParams, path_mode
from edgespec.edge.planner import Info, Planner
from edgespec.edge.transport import Retries
from edgespec.edge.types import ReplicaProbe, Result, ServerInfo
from edgespec.edge.wire import server_info
from edgespec.v1 import speculative_pb2 as pb
from edgespec.v1 import speculative_pb2_grpc as pb_grpc

DEFAULT_TIMEOUT_S = 30.0  # per reply: no single verdict or message may take longer
DEFAULT_MAX_RETRIES = 3  # consecutive failed attempts (without progress) before giving up
DEFAULT_CHANNEL_OPTIONS = (
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.max_receive_message_length", 16 * 1024 * 1024),
)
API_KEY_ENV = "EDGESPEC_API_KEY"  # read when no api_key is given


class KeyedStub:
    """The Speculative stub over this client's channel, with the API key in every call's metadata.

    ``reconnect()`` moves later calls to a fresh channel (a new connection through the ingress):
    after its replica drained, a session must not reopen over a connection that an old ingress
    process still serves with the replica list it had (HAProxy keeps a reloaded worker's
    connections, and its frozen list, until they close), or it lands on the draining replica
    again. Streams already on the old channel go on; it is closed after ``RETIRE_AFTER_S``.
    """

    RETIRE_AFTER_S = 120.0  # HAProxy's hard-stop-after for a reloaded worker is 120 s
    RECONNECT_EVERY_S = 0.05  # several sessions moving at once share one new connection

    def __init__(self, connect: Callable[[], grpc.aio.Channel], api_key: str | None):
        self._connect = connect
        self.channel = connect()
        self._stub = pb_grpc.SpeculativeStub(self.channel)
        self._metadata = (("authorization", f"Bearer {api_key}"),) if api_key else None
        self._retired: list[grpc.aio.Channel] = []
        self._connected_at = time.monotonic()

    def reconnect(self) -> None:
        if time.monotonic() - self._connected_at < self.RECONNECT_EVERY_S:
            return
        old = self.channel
        self.channel = self._connect()
        self._stub = pb_grpc.SpeculativeStub(self.channel)
        self._connected_at = time.monotonic()
        self._retired.append(old)
        asyncio.get_running_loop().call_later(self.RETIRE_AFTER_S, lambda: asyncio.ensure_future(self._retire(old)))

    async def _retire(self, channel: grpc.aio.Channel) -> None:
        if channel in self._retired:
            self._retired.remove(channel)
            await channel.close()

    async def close(self) -> None:
        for channel in [*self._retired, self.channel]:
            await channel.close()
        self._retired.clear()

    def Session(self, **kwargs):
        return self._stub.Session(metadata=self._metadata, **kwargs)

    def Generate(self, request, **kwargs):
        return self._stub.Generate(request, metadata=self._metadata, **kwargs)

    def Info(self, request, **kwargs):
        return self._stub.Info(request, metadata=self._metadata, **kwargs)


def channel_credentials(tls: bool, ca_cert: str | Path | None) -> grpc.ChannelCredentials | None:
    """TLS credentials trusting ``ca_cert`` (PEM file; None: the system's roots), or None for plaintext."""
    if ca_cert is not None and not tls:
        raise ValueError("ca_cert is for TLS connections: pass tls=True as well")
    if not tls:
        return None
    roots = None
    if ca_cert is not None:
        path = Path(ca_cert)
        if not path.is_file():
            raise FileNotFoundError(f"ca_cert: {path} not found (a PEM file of the CA that signed the server's certificate)")
        roots = path.read_bytes()
    return grpc.ssl_channel_credentials(root_certificates=roots)


class AsyncEdgeClient:
    """Speculative generation against an edgespec server.

    ``api_key`` (default: the EDGESPEC_API_KEY environment variable) goes in every call's
    metadata; ``tls=True`` connects with TLS, trusting ``ca_cert`` (a PEM file) or the system's
    roots; ``credentials`` gives any other grpc.ChannelCredentials instead. ``clock`` (seconds,
    ``time.perf_counter`` by default) is every time reading of the generation loop and the
    planner's probes: round trips, waits, drafting, the stream's rate (a test passes a scripted one).
    """

    def __init__(
        self,
        server: str,
        draft: DraftModel | str | Path,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        max_retries: int = DEFAULT_MAX_RETRIES,
        api_key: str | None = None,
        tls: bool = False,
        ca_cert: str | Path | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        channel_options: Sequence[tuple[str, Any]] = DEFAULT_CHANNEL_OPTIONS,
        draft_threads: int = 1,
        providers: Sequence[str] | None = None,
        clock: Clock = time.perf_counter,
    ):
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.server = server
        self.timeout, self.max_retries, self.clock = timeout, max_retries, clock
        credentials = credentials or channel_credentials(tls, ca_cert)
        self.draft = draft if isinstance(draft, DraftModel) else DraftModel(draft, threads=draft_threads, providers=providers)
        options = list(channel_options)
        if credentials is None:
            connect = lambda: grpc.aio.insecure_channel(server, options=options)  # noqa: E731
        else:
            connect = lambda: grpc.aio.secure_channel(server, credentials, options=options)  # noqa: E731
        self._stub = KeyedStub(connect, api_key or os.environ.get(API_KEY_ENV) or None)
        self._draft_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edgespec-draft")
        self._info: ServerInfo | None = None
        # What this client measured (round trip, forward time, acceptance): one planner per kind
        # of request (see planner()), kept across requests so each starts from what the last one learned.
        self._planners: dict[tuple, Planner] = {}
        self._chat_template: str | None = None  # read at the first chat ("": the draft has none)

    async def __aenter__(self) -> "AsyncEdgeClient":
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    async def close(self) -> None:
        await self._stub.close()
        self._draft_thread.shutdown(wait=False)

    # ---- server ------------------------------------------------------------------------

    async def info(self, *, refresh: bool = False) -> ServerInfo:
        """What the server serves; checks that its tokenizer is the draft's."""
        if self._info is None or refresh:
            reply = await self._unary_with_retries(lambda: self._stub.Info(pb.InfoRequest(), timeout=self.timeout))
            info = server_info(reply)
            if info.tokenizer_fingerprint != self.draft.manifest.tokenizer_fingerprint:
                raise TokenizerMismatchError(self.draft.manifest.tokenizer_fingerprint, info.tokenizer_fingerprint)
            self._info = info
        return self._info

    async def probe_rtt(self) -> float:
        """One Info round trip, in ms (the planner's view of the link while streaming cloud-only)."""
        return (await self.probe()).rtt_ms

    async def probe(self) -> ReplicaProbe:
        """One Info round trip: its ms, and the replica's recent verify forward, decoding step and
        stream rate that Info reports (0: not measured yet)."""
        started = self.clock()
        reply = await self._stub.Info(pb.InfoRequest(), timeout=self.timeout)
        return ReplicaProbe((self.clock() - started) * 1000, reply.forward_ms, reply.decode_ms, reply.stream_ms)

    async def planner(self, params: GenerationParams) -> Planner:
        """The planner for this kind of request; a new one starts from the server's step times
        and one round trip: the Info call that told them, when the channel was already warm.

        Requests share a planner only when the acceptance it forecasts is theirs: the same path
        mode, verification mode and temperature (a greedy request's acceptance says little about
        one sampled at T=1.2, and the reverse)."""
        mode = path_mode(params)
        key = (mode, params.mode, params.temperature, params.lookup)
        if key not in self._planners:
            planner = Planner(mode)
            warm, started = self._info is not None, self.clock()
            info = await self.info(refresh=True)  # the replica's current forward and decode costs
            info_ms = (self.clock() - started) * 1000
            rtt = None
            if mode != "cloud_only":
                try:  # on a warm channel the same call was a round trip; a cold one also connected
                    rtt = info_ms if warm else await self.probe_rtt()
                except grpc.RpcError:
                    pass  # the generation itself will report a dead server
            planner.observe(Info(info.forward_ms, info.decode_ms, info.stream_ms, rtt))
            self._planners[key] = planner
        return self._planners[key]

    async def _unary_with_retries(self, call):
        retries = Retries(self.max_retries, self.timeout)
        while True:
            try:
                return await call()
            except grpc.RpcError as exc:
                await asyncio.sleep(retries.decide(exc).delay_s)  # raises the typed error when giving up

    # ---- generation ---------------------------------------------------------------------

    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            ids = self.draft.tokenizer.encode(prompt).ids
        else:
            ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError("the prompt is empty: give at least one token of text")
        return ids

    async def generate(self, prompt: str | Sequence[int], **params: Any) -> Result:
        """Speculative generation; ``params`` are GenerationParams fields."""
        stream = self.stream(prompt, **params)
        async for _ in stream:
            pass
        if stream.result is None:  # the stream ends only after setting it (or raising)
            raise RuntimeError("the generation's stream ended without a result")
        return stream.result

    def stream(self, prompt: str | Sequence[int], **params: Any) -> "AsyncTextStream":
        """Yields text as verdicts arrive; ``.result`` holds the Result once exhausted."""
        return AsyncTextStream(self, self.encode(prompt), GenerationParams(**params))

    async def generate_cloud(self, prompt: str | Sequence[int], **params: Any) -> Result:
        """Cloud-only generation (the Generate RPC): the baseline, and the fallback."""
        return await self.generate(prompt, **{**params, "speculate": False})

    def chat_prompt(self, messages: Sequence[dict]) -> list[int]:
        """The token ids of ``messages`` ([{"role", "content"}, ...]) rendered with the draft's chat
        template, the assistant's turn opened: what the device server's /v1/chat/completions sends.
        ValueError when a message is malformed or the draft has no chat template."""
        if self._chat_template is None:
            self._chat_template = chat_template_of(self.draft.model_dir) or ""
        if not self._chat_template:
            raise ValueError(f"the draft ({self.draft.model_dir}) has no chat template (chat_template.jinja or "
                             "tokenizer_config.json's chat_template): render the prompt yourself and call generate")
        return self.encode(render_chat(self._chat_template, list(messages)))

    async def chat(self, messages: Sequence[dict], **params: Any) -> Result:
        """The assistant's reply to ``messages`` (``chat_prompt``); ``params`` as ``generate``'s.
        It ends at the model's end-of-turn token (one of the draft's end tokens, stopped on by default)."""
        return await self.generate(self.chat_prompt(messages), **params)

    def _generation(self, prompt_ids: list[int], params: GenerationParams, info: ServerInfo, planner: Planner) -> Generation:
        return Generation(
            self._stub,
            self.draft.fork(),  # each generation its own context and cache, shared weights
            self._draft_thread, prompt_ids, params, info,
            timeout=self.timeout, max_retries=self.max_retries, planner=planner, rtt_probe=self.probe, clock=self.clock,
        )


class AsyncTextStream:
    """Async iterator of text pieces for one generation; closes its session when done."""

    def __init__(self, client: AsyncEdgeClient, prompt_ids: list[int], params: GenerationParams):
        self._client, self._prompt_ids, self._params = client, prompt_ids, params
        self._decoder = IncrementalDecoder(client.draft.tokenizer)
        self._iterator: AsyncIterator[str] | None = None
        self._run: Generation | None = None
        self.result: Result | None = None

    @property
    def token_ids(self) -> list[int]:
        """The tokens generated so far (a copy)."""
        return list(self._run.generated) if self._run else []

    @property
    def segments(self) -> list[tuple[str, int]]:
        """So far: which path produced how many tokens, in order (see Result.segments)."""
        return list(self._run.segments) if self._run else []

    def __aiter__(self) -> AsyncIterator[str]:
        if self._iterator is None:
            self._iterator = self._pieces()
        return self._iterator

    async def _pieces(self) -> AsyncIterator[str]:
        client = self._client
        info = await client.info()
        run = self._run = client._generation(self._prompt_ids, self._params, info, await client.planner(self._params))
        try:
            async for tokens in run.chunks():
                piece = self._decoder.push(tokens)
                if piece:
                    yield piece
        except EdgespecError as exc:
            # Nothing committed is lost: the error carries what was generated before it.
            self.result = self._result(run, finish_reason="error")
            exc.partial = self.result
            raise
        tail = self._decoder.flush()
        if tail:
            yield tail
        self.result = self._result(run, finish_reason=run.finish_reason)

    def _result(self, run: Generation, finish_reason: str) -> Result:
        return Result(
            text=self._decoder.text,
            token_ids=list(run.generated),
            prompt_ids=self._prompt_ids,
            finish_reason=finish_reason,
            stats=run.stats,
            rounds=list(run.rounds),
            segments=list(run.segments),
        )
