"""An OpenAI-compatible HTTP server on the device: apps that talk to a local completions server
(the convention of vLLM, llama.cpp's server, Ollama, LM Studio) speculate with the cloud
verifier without a line of new code.

    edgespec device-server --server cloud.example.com:443 --tls --draft drafts/my-draft --port 8080

Endpoints (JSON; errors as ``{"error": {"message", "type", "param", "code"}}`` with a 4xx/5xx):

- ``GET /health``: 200 while the server is up, with its running and queued generations;
- ``GET /v1/models``: the served model (the verifier's ``model_id``);
- ``POST /v1/completions``: ``prompt`` (a string, or a list of token ids), ``max_tokens``
  (default 16, OpenAI's), ``temperature`` (default 1, OpenAI's; 0 is greedy: the target's own
  greedy output), ``top_p``, ``top_k``, ``stop`` (a string or up to 4), ``seed``, ``stream``
  (server-sent events, ending ``data: [DONE]``) with ``stream_options.include_usage``, ``n`` = 1;
- ``POST /v1/chat/completions``: the same fields, ``messages`` (content a string or an array of
  text parts) rendered with the tokenizer's chat template; ``max_completion_tokens`` or
  ``max_tokens``, and without either it runs to a stop or the context's end.

Several generations run at once (``DeviceServerConfig.max_concurrent``), each on its own fork
of the one draft model (own context and KV cache, shared weights; the SDK's concurrency), with a
bounded queue behind them (``edgespec.edge.request_gate``: 429 when full, 503 after a bounded
wait, both with ``Retry-After``). CORS is off unless origins are named. Every request leaves one
access-log line (logger ``edgespec.device_server.access``): method, path, status, tokens, ms;
never prompt or generated text. Field parsing is ``edgespec.edge.openai_request``; what is
supported and refused is docs/device-server.md. Only the Python standard library is used.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Generator

from edgespec.edge import openai_request as fields
from edgespec.edge.eos import chat_template_of
from edgespec.edge.errors import CapacityError, EdgespecError, InvalidRequestError
from edgespec.edge.openai_request import RequestError, generation_params  # noqa: F401  (the server's public names)
from edgespec.edge.request_gate import Busy, RequestGate
from edgespec.edge.stops import StopMatcher

DEFAULT_MAX_TOKENS = fields.DEFAULT_MAX_TOKENS
ACCESS_LOG = logging.getLogger("edgespec.device_server.access")
CORS_METHODS = "GET, POST, OPTIONS"
CORS_HEADERS = "Authorization, Content-Type"  # when a preflight names none
CORS_MAX_AGE_S = 600


@dataclass(frozen=True)
class DeviceServerConfig:
    """max_concurrent: generations at once (each its own draft cache); max_queue: requests that
    may wait for one (more get 429); queue_timeout_s: the longest wait (then 503);
    cors_origins: origins browsers may call from (``*``: any; empty: CORS off)."""

    max_concurrent: int = 4
    max_queue: int = 16
    queue_timeout_s: float = 30.0
    cors_origins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.max_concurrent, int) or self.max_concurrent < 1:
            raise ValueError(f"max_concurrent must be an integer >= 1, got {self.max_concurrent!r}")
        if not isinstance(self.max_queue, int) or self.max_queue < 0:
            raise ValueError(f"max_queue must be an integer >= 0, got {self.max_queue!r}")
        if not (isinstance(self.queue_timeout_s, (int, float)) and 0 <= self.queue_timeout_s <= 3600):
            raise ValueError(f"queue_timeout_s must be in [0, 3600] seconds, got {self.queue_timeout_s!r}")
        if isinstance(self.cors_origins, str):
            raise ValueError(f"cors_origins must be a list of origins, got the string {self.cors_origins!r}")
        origins = tuple(origin.rstrip("/") if origin != "*" else origin for origin in self.cors_origins)
        for origin in origins:
            if not origin or any(c.isspace() for c in origin) or "," in origin:
                raise ValueError(f"cors_origins: {origin!r} is not an origin (like https://app.example or *)")
        object.__setattr__(self, "cors_origins", origins)

    def allows(self, origin: str | None) -> bool:
        return bool(origin) and ("*" in self.cors_origins or origin in self.cors_origins)


def chat_template(draft_dir: Path) -> str | None:
    """The draft's chat template: ``chat_template.jinja`` or ``tokenizer_config.json``'s (edgespec.edge.eos)."""
    return chat_template_of(draft_dir)


class DeviceServer(ThreadingHTTPServer):
    """The HTTP server; ``client`` is an ``EdgeClient`` connected to the verifier (its
    generations may run concurrently: each streams on its own fork of the draft)."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], client, draft_dir: Path, *, model_name: str | None = None,
                 config: DeviceServerConfig | None = None):
        self.config = config or DeviceServerConfig()
        self.client, self.draft_dir = client, Path(draft_dir)
        self.model_name = model_name or client.info().model_id
        self.template = chat_template(draft_dir)
        self.gate = RequestGate(self.config.max_concurrent, self.config.max_queue, self.config.queue_timeout_s)
        super().__init__(address, Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def max_new_tokens(self, prompt_ids: list[int], requested: int | None, *, chat: bool) -> int:
        """``requested``, or (None) all the room the model's context leaves after the prompt."""
        info = self.client.info()
        room = info.max_context - len(prompt_ids)
        if room < 1:
            raise RequestError(f"the prompt is {len(prompt_ids)} tokens: the model's context holds {info.max_context}",
                               "messages" if chat else "prompt")
        if requested is None:
            return min(room, info.max_new_tokens) if info.max_new_tokens else room
        if info.max_new_tokens and requested > info.max_new_tokens:
            raise RequestError(f"'max_tokens' (or 'max_completion_tokens') {requested} is over the verifier's limit of "
                               f"{info.max_new_tokens} tokens per request", "max_tokens")
        return requested

    def generate(self, prompt_ids: list[int], params: dict, stops: list[str]) -> Generator[tuple[str, str | None, dict], None, None]:
        """(text piece, finish reason or None, usage) as the generation goes; the caller holds a gate slot.

        The parameters are checked now (ValueError), before any reply is sent; the generation
        starts when the pieces are first asked for."""
        return self._pieces(self.client.stream(prompt_ids, **params), len(prompt_ids), stops)

    @staticmethod
    def _pieces(stream, prompt_tokens: int, stops: list[str]) -> Generator[tuple[str, str | None, dict], None, None]:
        matcher = StopMatcher(stops)
        try:
            for piece in stream:
                out = matcher.feed(piece)
                if out:
                    yield out, None, {}
                if matcher.stopped:
                    break
        finally:
            stream.close()
        tail = matcher.flush()
        result = stream.result
        completion = len(stream.token_ids)
        finish = "stop" if matcher.stopped or (result is not None and result.finish_reason == "stop_token") else "length"
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}
        yield tail, finish, usage


class Handler(BaseHTTPRequestHandler):
    # (typeshed's BaseRequestHandler is not generic in its server: a Handler only ever serves a DeviceServer)
    server: DeviceServer  # pyright: ignore[reportIncompatibleVariableOverride]
    protocol_version = "HTTP/1.1"
    timeout = 60  # seconds a connection may sit silent (mid-request or between requests)
    MAX_BODY = 16 << 20

    def log_message(self, format: str, *args) -> None:  # noqa: A002  (the access log replaces it)
        pass

    # ---- every request: CORS headers, the access log ------------------------------------------

    def _served(self, route) -> None:
        started = time.perf_counter()
        self._status, self._usage = 0, {}
        origin = self.headers.get("Origin")
        self._cors = self._cors_headers(origin) if origin is not None and self.server.config.allows(origin) else {}
        try:
            route()
        finally:
            ms = (time.perf_counter() - started) * 1000
            ACCESS_LOG.info('%s "%s %s" %d prompt_tokens=%d completion_tokens=%d %.1f ms', self.client_address[0],
                            self.command, self.path.split("?", 1)[0], self._status,
                            self._usage.get("prompt_tokens", 0), self._usage.get("completion_tokens", 0), ms)

    def _cors_headers(self, origin: str) -> dict:
        if "*" in self.server.config.cors_origins:
            return {"Access-Control-Allow-Origin": "*", "Access-Control-Expose-Headers": "Retry-After"}
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin", "Access-Control-Expose-Headers": "Retry-After"}

    def send_response(self, code: int, message: str | None = None) -> None:
        self._status = int(code)
        super().send_response(code, message)

    def end_headers(self) -> None:
        for name, value in getattr(self, "_cors", {}).items():
            self.send_header(name, value)
        super().end_headers()

    def do_GET(self) -> None:  # noqa: N802
        self._served(self._get)

    def do_POST(self) -> None:  # noqa: N802
        self._served(self._post)

    def do_OPTIONS(self) -> None:  # noqa: N802
        self._served(self._options)

    # ---- plumbing ---------------------------------------------------------------------------

    def _json(self, status: int, body: dict, headers: dict | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
               headers: dict | None = None) -> None:
        self._json(status, {"error": {"message": message, "type": kind, "param": param, "code": None}}, headers)

    def _body(self) -> dict:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise RequestError("Content-Length must be a number of bytes") from None
        if length < 0:
            raise RequestError("Content-Length must be >= 0")
        if length > self.MAX_BODY:
            raise RequestError("request body over 16 MiB", status=HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError as exc:
            raise RequestError(f"the body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise RequestError("the body must be a JSON object")
        return body

    def _sse(self, chunks: Generator[dict, None, None]) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            try:
                for chunk in chunks:
                    self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                    self.wfile.flush()
            except EdgespecError as exc:  # after the headers: the error travels as an event
                error = {"error": {"message": f"the cloud verifier: {exc}", "type": "api_error", "param": None, "code": None}}
                self.wfile.write(b"data: " + json.dumps(error).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass  # the app went away, or stopped reading for Handler.timeout
        finally:
            chunks.close()  # ends the generation now, before its slot is given back

    # ---- routes -----------------------------------------------------------------------------

    def _options(self) -> None:
        """A CORS preflight (Origin + Access-Control-Request-Method), or a plain OPTIONS."""
        origin, method = self.headers.get("Origin"), self.headers.get("Access-Control-Request-Method")
        if not origin or not method:
            self.send_response(HTTPStatus.NO_CONTENT)
            self.send_header("Allow", CORS_METHODS)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if not self.server.config.allows(origin):
            self._error(403, f"origin {origin!r} may not call this server: start it with --cors-origin {origin} "
                             "(or --cors-origin '*')", kind="permission_error")
            return
        if method.upper() not in ("GET", "POST"):
            self._error(403, f"method {method} is not served (GET, POST)", kind="permission_error")
            return
        self.send_response(HTTPStatus.NO_CONTENT)
        self.send_header("Access-Control-Allow-Methods", CORS_METHODS)
        self.send_header("Access-Control-Allow-Headers", self.headers.get("Access-Control-Request-Headers") or CORS_HEADERS)
        self.send_header("Access-Control-Max-Age", str(CORS_MAX_AGE_S))
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _get(self) -> None:
        route = self.path.split("?", 1)[0].rstrip("/")
        if route == "/health":
            self._json(200, {"status": "ok", "model": self.server.model_name, "generations": self.server.gate.snapshot()})
        elif route == "/v1/models":
            self._json(200, {"object": "list", "data": [
                {"id": self.server.model_name, "object": "model", "created": 0, "owned_by": "edgespec"}]})
        else:
            self._error(404, f"no route GET {self.path}; try /v1/models or /health", kind="not_found_error")

    def _post(self) -> None:
        route = self.path.split("?", 1)[0].rstrip("/")
        # Until the body is read, a refusal closes the connection: unread bytes must not pass for a next request.
        keep_alive, self.close_connection = self.close_connection, True
        try:
            if route not in ("/v1/completions", "/v1/chat/completions"):
                raise RequestError(f"no route POST {self.path}; try /v1/completions or /v1/chat/completions",
                                   status=HTTPStatus.NOT_FOUND)
            body = self._body()
            self.close_connection = keep_alive
            chat = route.endswith("chat/completions")
            fields.refuse_unsupported(body)
            params, stops, usage = generation_params(body, chat=chat), fields.stops(body), fields.include_usage(body)
            prompt_ids = self.server.client.encode(self._prompt(body, chat))
            params["max_new_tokens"] = self.server.max_new_tokens(prompt_ids, params["max_new_tokens"], chat=chat)
            with self.server.gate.admit():
                self._complete(body, chat, prompt_ids, params, stops, usage)
        except Busy as exc:
            self._error(exc.status, exc.message, kind="rate_limit_error" if exc.status == 429 else "overloaded_error",
                        headers={"Retry-After": str(exc.retry_after_s)})
        except RequestError as exc:
            self._error(exc.status, exc.message, exc.param)
        except (InvalidRequestError, ValueError) as exc:
            self._error(400, str(exc))
        except CapacityError as exc:  # the verifier is full for now: the app may retry, as for our own 503
            self._error(503, f"the cloud verifier: {exc}", kind="overloaded_error", headers={"Retry-After": "1"})
        except EdgespecError as exc:
            self._error(502, f"the cloud verifier: {exc}", kind="api_error")

    def _prompt(self, body: dict, chat: bool):
        if not chat:
            return fields.prompt(body)
        if self.server.template is None:
            raise RequestError(
                f"the model's tokenizer has no chat template ({self.server.draft_dir / 'chat_template.jinja'} or tokenizer_config.json): "
                "use /v1/completions with a prompt", "messages")
        return fields.render_chat(self.server.template, body.get("messages"))

    def _complete(self, body: dict, chat: bool, prompt_ids: list[int], params: dict, stops: list[str], usage: bool) -> None:
        request_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created, model = int(time.time()), self.server.model_name
        pieces = self.server.generate(prompt_ids, params, stops)
        if body.get("stream"):
            self._sse(self._chunks(pieces, chat, request_id, created, model, usage))
            return
        text, finish = [], "length"
        try:
            for piece, done, counts in pieces:
                text.append(piece)
                if done:
                    finish, self._usage = done, counts
        finally:
            pieces.close()
        content = "".join(text)
        choice = ({"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish} if chat
                  else {"index": 0, "text": content, "logprobs": None, "finish_reason": finish})
        self._json(200, {"id": request_id, "object": "chat.completion" if chat else "text_completion", "created": created,
                         "model": model, "choices": [choice], "usage": self._usage})

    def _chunks(self, pieces, chat: bool, request_id: str, created: int, model: str, usage: bool) -> Generator[dict, None, None]:
        kind = "chat.completion.chunk" if chat else "text_completion"
        head = {"id": request_id, "object": kind, "created": created, "model": model}
        first = True
        try:
            for piece, finish, counts in pieces:
                if chat:
                    delta = {"role": "assistant", "content": piece} if first else {"content": piece}
                    choice = {"index": 0, "delta": delta if (piece or first) else {}, "finish_reason": finish}
                else:
                    choice = {"index": 0, "text": piece, "logprobs": None, "finish_reason": finish}
                first = False
                if finish:
                    self._usage = counts
                if piece or finish:
                    yield {**head, "choices": [choice], **({"usage": None} if usage else {})}
        finally:
            pieces.close()
        if usage:  # OpenAI's last chunk: no choices, the whole request's usage
            yield {**head, "choices": [], "usage": self._usage}
