"""The blocking client: ``with EdgeClient(server, draft) as c: c.generate(...)``.

A thin twin of ``AsyncEdgeClient`` with the same methods: it runs the async client on the
process's SDK loop (``loop.shared_loop``: one thread for every blocking client, never closed,
so no gRPC completion outlives its loop) and waits for each call, so the two never drift apart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Sequence

from edgespec.edge.aclient import AsyncEdgeClient
from edgespec.edge.draft import DraftModel
from edgespec.edge.loop import run
from edgespec.edge.types import Result, ServerInfo


class EdgeClient:
    """Speculative generation against an edgespec server; see AsyncEdgeClient for the options
    (timeout, max_retries, api_key, tls, ca_cert, credentials, draft_threads, providers: the draft's
    ONNX Runtime execution providers, CPU by default)."""

    def __init__(self, server: str, draft: DraftModel | str | Path, **options: Any):
        self._closed = False

        async def make() -> AsyncEdgeClient:
            return AsyncEdgeClient(server, draft, **options)  # the aio channel binds to the shared loop

        self._client = run(make())

    def __enter__(self) -> "EdgeClient":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @property
    def draft(self) -> DraftModel:
        return self._client.draft

    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        """Token ids of a prompt, with the draft's (= the target's) tokenizer."""
        return self._client.encode(prompt)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        run(self._client.close())

    def info(self, *, refresh: bool = False) -> ServerInfo:
        return self._wait(self._client.info(refresh=refresh))

    def generate(self, prompt: str | Sequence[int], **params: Any) -> Result:
        return self._wait(self._client.generate(prompt, **params))

    def generate_cloud(self, prompt: str | Sequence[int], **params: Any) -> Result:
        return self._wait(self._client.generate_cloud(prompt, **params))

    def chat_prompt(self, messages: Sequence[dict]) -> list[int]:
        """``messages`` rendered with the draft's chat template, as token ids (AsyncEdgeClient.chat_prompt)."""
        return self._client.chat_prompt(messages)

    def chat(self, messages: Sequence[dict], **params: Any) -> Result:
        """The assistant's reply to ``messages`` ([{"role", "content"}, ...]); ``params`` as ``generate``'s."""
        return self._wait(self._client.chat(messages, **params))

    def stream(self, prompt: str | Sequence[int], **params: Any) -> "TextStream":
        return TextStream(self, self._client.stream(prompt, **params))

    def _wait(self, coroutine):
        if self._closed:
            coroutine.close()
            raise RuntimeError("the client is closed")
        return run(coroutine)


class TextStream:
    """Iterator of text pieces as verdicts arrive; ``.result`` once exhausted; closes itself."""

    def __init__(self, client: EdgeClient, stream):
        self._client, self._stream = client, stream
        self._pieces = stream.__aiter__()
        self._done = False

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        if self._done:
            raise StopIteration
        try:
            return self._client._wait(self._pieces.__anext__())
        except StopAsyncIteration:
            self._done = True
            raise StopIteration from None

    def __enter__(self) -> "TextStream":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Ends the generation early (closing its session) if it is still running."""
        if not self._done:
            self._done = True
            self._client._wait(self._pieces.aclose())

    @property
    def result(self) -> Result | None:
        return self._stream.result

    @property
    def token_ids(self) -> list[int]:
        """The tokens generated so far."""
        return self._stream.token_ids

    @property
    def segments(self) -> list[tuple[str, int]]:
        """So far: which path produced how many tokens, in order."""
        return self._stream.segments
