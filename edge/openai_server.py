"""An OpenAI-compatible HTTP server on the device: apps that talk to a local completions server
(the convention of vLLM, llama.cpp's server, Ollama, LM Studio) speculate with the cloud
verifier without a line of new code.

    edgespec device-server --server cloud.example.com:443 --tls --draft drafts/my-draft --port 8080

Endpoints (JSON; errors as ``{"error": {"message", "type", "param", "code"}}`` with a 4xx/5xx):

- ``GET /v1/models``: the served model (the verifier's ``model_id``);
- ``POST /v1/completions``: ``prompt`` (a string, or a list of token ids), ``max_tokens``
  (default 16), ``temperature`` (default 1, OpenAI's; 0 is greedy: the target's own greedy
  output), ``top_p``, ``stop`` (a string or up to 4), ``seed``, ``stream`` (server-sent events,
  ending ``data: [DONE]``), ``n`` = 1 only;
- ``POST /v1/chat/completions``: ``messages`` rendered with the tokenizer's chat template
  (``chat_template.jinja`` or ``chat_template`` in the draft's ``tokenizer_config.json``; needs ``jinja2``); a draft
  without one answers 400.

Sampling uses exact verification (the target's distribution); greedy is lossless token for
token. Generations run one at a time (the device has one draft model); others wait their turn.
Only the Python standard library is used: the device SDK's dependencies stay as they are.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

from edgespec.edge.eos import chat_template_of
from edgespec.edge.errors import EdgespecError, InvalidRequestError

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions
MAX_STOP = 4


class RequestError(Exception):
    """A request the server refuses: HTTP 400 (or ``status``) with an OpenAI-style error body."""

    def __init__(self, message: str, param: str | None = None, status: HTTPStatus = HTTPStatus.BAD_REQUEST):
        super().__init__(message)
        self.message, self.param, self.status = message, param, status


def _number(body: dict, name: str, default, kind=float, low=None, high=None):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not float(value).is_integer()):
        raise RequestError(f"'{name}' must be a{'n integer' if kind is int else ' number'}, got {value!r}", name)
    value = kind(value)
    if (low is not None and value < low) or (high is not None and value > high):
        raise RequestError(f"'{name}' must be in [{low}, {high}], got {value!r}", name)
    return value


def _stops(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOP:
        raise RequestError(f"'stop' must be a non-empty string or a list of at most {MAX_STOP} of them", "stop")
    return stops


def generation_params(body: dict) -> dict:
    """The SDK's generation parameters from an OpenAI request body (validated)."""
    if _number(body, "n", 1, int, 1, 1) != 1:
        raise RequestError("only n = 1 is supported", "n")
    temperature = _number(body, "temperature", 1.0, float, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, float, 0.0, 1.0)
    params: dict[str, Any] = {"max_new_tokens": _number(body, "max_tokens", DEFAULT_MAX_TOKENS, int, 1, None)}
    if temperature > 0:
        # The SDK's default mode (coupled): draws keyed by position, so a seed reproduces at any k.
        params.update(temperature=max(temperature, 1e-3), top_p=top_p if top_p > 0 else 1.0)
    seed = _number(body, "seed", None, int, 0, 2**63 - 1)
    if seed is not None:
        params["seed"] = seed
    return params


class StopMatcher:
    """Cuts a text stream at the first stop string; holds back what might begin one."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.text = ""  # everything generated so far
        self.sent = 0  # characters already released
        self.stopped = False

    def feed(self, piece: str) -> str:
        """The newly releasable text after ``piece`` (nothing once a stop string was seen)."""
        if self.stopped:
            return ""
        self.text += piece
        for stop in self.stops:
            at = self.text.find(stop, max(0, self.sent - len(stop) + 1))
            if at >= 0:
                self.stopped = True
                self.text = self.text[:at]
                break
        hold = 0 if self.stopped else max((len(s) - 1 for s in self.stops), default=0)
        # Release all but a tail that could be the start of a stop string.
        end = len(self.text)
        if hold:
            for n in range(min(hold, end - self.sent), 0, -1):
                if any(s.startswith(self.text[end - n :]) for s in self.stops):
                    end -= n
                    break
        out, self.sent = self.text[self.sent : end], max(self.sent, end)
        return out

    def flush(self) -> str:
        out, self.sent = self.text[self.sent :], len(self.text)
        return out


def chat_template(draft_dir: Path) -> str | None:
    """The draft's chat template: ``chat_template.jinja`` or ``tokenizer_config.json``'s (edgespec.edge.eos)."""
    return chat_template_of(draft_dir)


def render_chat(template: str, messages: Any) -> str:
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list of {role, content}", "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) or not isinstance(message.get("content"), str):
            raise RequestError(f"messages[{i}] must have a string 'role' and a string 'content'", "messages")
    try:
        import jinja2
    except ImportError:
        raise RequestError("rendering the chat template needs jinja2 on the device (pip install jinja2)",
                           status=HTTPStatus.NOT_IMPLEMENTED) from None
    environment = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    return environment.from_string(template).render(messages=messages, add_generation_prompt=True, bos_token="", eos_token="")


class DeviceServer(ThreadingHTTPServer):
    """The HTTP server; ``client`` is an ``EdgeClient`` connected to the verifier."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], client, draft_dir: Path, *, model_name: str | None = None):
        super().__init__(address, Handler)
        self.client, self.draft_dir = client, Path(draft_dir)
        self.model_name = model_name or client.info().model_id
        self.template = chat_template(draft_dir)
        self.lock = threading.Lock()  # one generation at a time: the device has one draft

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def generate(self, prompt, params: dict, stops: list[str]) -> Iterator[tuple[str, str | None, dict]]:
        """(text piece, finish reason or None, usage) as the generation goes."""
        with self.lock:
            matcher = StopMatcher(stops)
            stream = self.client.stream(prompt, **params)
            prompt_tokens = len(self.client.encode(prompt))
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
            if matcher.stopped or (result is not None and result.finish_reason == "stop_token"):
                finish = "stop"
            else:
                finish = "length"
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}
            yield tail, finish, usage


class Handler(BaseHTTPRequestHandler):
    server: DeviceServer
    protocol_version = "HTTP/1.1"
    timeout = 60  # seconds a connection may sit silent (mid-request or between requests)
    MAX_BODY = 16 << 20

    def log_message(self, format: str, *args) -> None:  # noqa: A002  (quiet by default)
        pass

    # ---- plumbing ---------------------------------------------------------------------------

    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error") -> None:
        self._json(status, {"error": {"message": message, "type": kind, "param": param, "code": None}})

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

    def _sse(self, chunks: Iterator[dict]) -> None:
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
        except (BrokenPipeError, ConnectionResetError):
            pass  # the app went away: the generator's close ends the generation

    # ---- routes -----------------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802
        if self.path.rstrip("/") == "/v1/models":
            self._json(200, {"object": "list", "data": [
                {"id": self.server.model_name, "object": "model", "created": 0, "owned_by": "edgespec"}]})
        else:
            self._error(404, f"no route GET {self.path}; try /v1/models", kind="not_found_error")

    def do_POST(self) -> None:  # noqa: N802
        route = self.path.rstrip("/")
        try:
            if route not in ("/v1/completions", "/v1/chat/completions"):
                raise RequestError(f"no route POST {self.path}; try /v1/completions or /v1/chat/completions",
                                   status=HTTPStatus.NOT_FOUND)
            body = self._body()
            chat = route.endswith("chat/completions")
            prompt = self._prompt(body, chat)
            params, stops = generation_params(body), _stops(body)
            self._complete(body, chat, prompt, params, stops)
        except RequestError as exc:
            self._error(exc.status, exc.message, exc.param)
        except (InvalidRequestError, ValueError) as exc:
            self._error(400, str(exc))
        except EdgespecError as exc:
            self._error(502, f"the cloud verifier: {exc}", kind="api_error")

    def _prompt(self, body: dict, chat: bool):
        if chat:
            if self.server.template is None:
                raise RequestError(
                    f"the model's tokenizer has no chat template ({self.server.draft_dir / 'chat_template.jinja'} or tokenizer_config.json): "
                    "use /v1/completions with a prompt", "messages")
            return render_chat(self.server.template, body.get("messages"))
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str) and prompt:
            return prompt
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return prompt
        raise RequestError("'prompt' must be a non-empty string or a list of token ids (one prompt per request)", "prompt")

    def _complete(self, body: dict, chat: bool, prompt, params: dict, stops: list[str]) -> None:
        request_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created, model = int(time.time()), self.server.model_name
        pieces = self.server.generate(prompt, params, stops)
        if body.get("stream"):
            self._sse(self._chunks(pieces, chat, request_id, created, model))
            return
        text, finish, usage = [], "length", {}
        for piece, done, counts in pieces:
            text.append(piece)
            if done:
                finish, usage = done, counts
        content = "".join(text)
        choice = ({"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish} if chat
                  else {"index": 0, "text": content, "logprobs": None, "finish_reason": finish})
        self._json(200, {"id": request_id, "object": "chat.completion" if chat else "text_completion", "created": created,
                         "model": model, "choices": [choice], "usage": usage})

    @staticmethod
    def _chunks(pieces, chat: bool, request_id: str, created: int, model: str) -> Iterator[dict]:
        kind = "chat.completion.chunk" if chat else "text_completion"
        first = True
        try:
            for piece, finish, _ in pieces:
                if chat:
                    delta = {"role": "assistant", "content": piece} if first else {"content": piece}
                    choice = {"index": 0, "delta": delta if (piece or first) else {}, "finish_reason": finish}
                else:
                    choice = {"index": 0, "text": piece, "logprobs": None, "finish_reason": finish}
                first = False
                if piece or finish:
                    yield {"id": request_id, "object": kind, "created": created, "model": model, "choices": [choice]}
        finally:
            pieces.close()
