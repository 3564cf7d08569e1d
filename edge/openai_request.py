"""OpenAI request bodies to the SDK's terms: validated fields, stop strings, chat messages.

Pure functions, no I/O: each refusal is a ``RequestError`` naming the field (HTTP 400 unless
``status`` says otherwise). The HTTP server is ``edgespec.edge.openai_server``; what is
supported and what is refused, and why, is listed in docs/device-server.md.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for (legacy) completions; chat runs to a stop or the context's end
MAX_STOP = 4


class RequestError(ValueError):
    """A request the server refuses: HTTP 400 (or ``status``) with an OpenAI-style error body. A
    ValueError, so the SDK's ``chat`` (which renders messages with ``render_chat``) raises one."""

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


def max_tokens(body: dict, *, chat: bool) -> int | None:
    """The most tokens to generate; None (chat without a limit): until a stop or the context's end.

    ``max_completion_tokens`` (chat's current name) wins over ``max_tokens`` (its deprecated
    one, and the completions field), as in vLLM."""
    for name in ("max_completion_tokens", "max_tokens"):
        value = _number(body, name, None, int, 1, None)
        if value is not None:
            return int(value)  # (an int already: _number's type follows its kind only at run time)
    return None if chat else DEFAULT_MAX_TOKENS


def generation_params(body: dict, *, chat: bool = False) -> dict:
    """The SDK's generation parameters from an OpenAI request body (validated).

    ``max_new_tokens`` is None for a chat request without a limit: the server fills in the room
    left in the model's context (it knows the prompt's length and the verifier's limits)."""
    if _number(body, "n", 1, int, 1, 1) != 1:
        raise RequestError("only n = 1 is supported", "n")
    temperature = _number(body, "temperature", 1.0, float, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, float, 0.0, 1.0)
    top_k = _number(body, "top_k", 0, int, -1, None)  # vLLM's field: -1 or 0 is off
    params: dict[str, Any] = {"max_new_tokens": max_tokens(body, chat=chat)}
    if temperature > 0:
        # The SDK's default mode (coupled): draws keyed by position, so a seed reproduces at any k.
        params.update(temperature=max(temperature, 1e-3), top_p=top_p if top_p > 0 else 1.0)
        if top_k > 0:  # greedy takes the argmax, which every top-k keeps: nothing to apply
            params["top_k"] = top_k
    seed = _number(body, "seed", None, int, 0, 2**63 - 1)
    if seed is not None:
        params["seed"] = seed
    return params


def stops(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    listed = [stop] if isinstance(stop, str) else stop
    if not isinstance(listed, list) or not all(isinstance(s, str) and s for s in listed) or len(listed) > MAX_STOP:
        raise RequestError(f"'stop' must be a non-empty string or a list of at most {MAX_STOP} of them", "stop")
    return listed


def include_usage(body: dict) -> bool:
    """``stream_options.include_usage``: a last streamed chunk with the usage (and ``usage: null`` before it)."""
    options = body.get("stream_options")
    if options is None:
        return False
    if not body.get("stream"):
        raise RequestError("'stream_options' is only allowed with stream = true", "stream_options")
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise RequestError("'stream_options' must be an object like {\"include_usage\": true}", "stream_options")
    return options.get("include_usage", False)


# Fields that would change what is generated, and that the device server cannot honour: refused,
# never silently ignored. Each: (field, is it in use?, why not).
_NOT_SUPPORTED = (
    ("tools", lambda v: bool(v), "tool calling is not supported: the device server generates plain text"),
    ("functions", lambda v: bool(v), "function calling is not supported: the device server generates plain text"),
    ("response_format", lambda v: isinstance(v, dict) and v.get("type", "text") != "text",
     "structured output (JSON mode, JSON schema) is not supported: it needs a grammar mask on the draft and the verifier"),
    ("logit_bias", lambda v: bool(v), "'logit_bias' is not supported: the verifier samples from the target's own distribution"),
    ("presence_penalty", lambda v: v not in (None, 0, 0.0), "penalties are not supported: the verifier samples from the target's own distribution"),
    ("frequency_penalty", lambda v: v not in (None, 0, 0.0), "penalties are not supported: the verifier samples from the target's own distribution"),
    ("repetition_penalty", lambda v: v not in (None, 1, 1.0), "penalties are not supported: the verifier samples from the target's own distribution"),
    ("min_p", lambda v: v not in (None, 0, 0.0), "'min_p' is not supported (temperature, top_p and top_k are)"),
    ("top_logprobs", lambda v: v not in (None, 0), "log probabilities are not returned"),
    ("best_of", lambda v: v not in (None, 1), "only best_of = 1 is supported"),
    ("echo", lambda v: bool(v), "'echo' is not supported"),
    ("suffix", lambda v: bool(v), "'suffix' (fill in the middle) is not supported"),
    ("audio", lambda v: bool(v), "audio output is not supported: the model writes text"),
    ("modalities", lambda v: v not in (None, ["text"]), "only the 'text' modality is supported"),
)


def refuse_unsupported(body: dict) -> None:
    for name, used, why in _NOT_SUPPORTED:
        if used(body.get(name)):
            raise RequestError(why, name)
    logprobs = body.get("logprobs")
    if logprobs not in (None, False, 0):  # chat: a bool; completions: how many
        raise RequestError("log probabilities are not returned", "logprobs")


def prompt(body: dict):
    """A completions prompt: a non-empty string or a list of token ids."""
    value = body.get("prompt")
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        value = value[0]
    if isinstance(value, str) and value:
        return value
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return value
    raise RequestError("'prompt' must be a non-empty string or a list of token ids (one prompt per request)", "prompt")


def message_text(content: Any, where: str) -> str:
    """A message's content as text: a string, or an array of text parts (joined with newlines, as vLLM does)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise RequestError(f"{where} must be a string or a non-empty array of text parts", "messages")
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            shown = repr(kind) if isinstance(kind, str) else "untyped"
            raise RequestError(f"{where}[{i}] is a {shown} part: only 'text' parts are supported (the model reads text)",
                               "messages")
        if not isinstance(part.get("text"), str):
            raise RequestError(f"{where}[{i}] is a text part without a string 'text'", "messages")
        texts.append(part["text"])
    return "\n".join(texts)


def chat_messages(messages: Any) -> list[dict]:
    """Validated messages for the chat template, each content as one string."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list of {role, content}", "messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(f"messages[{i}] must have a string 'role' and a 'content'", "messages")
        out.append({**message, "content": message_text(message.get("content"), f"messages[{i}].content")})
    return out


def render_chat(template: str, messages: Any) -> str:
    """``messages`` rendered with a chat template, the assistant's turn opened (the one rendering
    of the device server's /v1/chat/completions and the SDK's ``chat``)."""
    checked = chat_messages(messages)
    try:
        import jinja2
    except ImportError:
        raise RequestError("rendering the chat template needs jinja2 on the device (pip install jinja2)",
                           status=HTTPStatus.NOT_IMPLEMENTED) from None
    environment = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    return environment.from_string(template).render(messages=checked, add_generation_prompt=True, bos_token="", eos_token="")
