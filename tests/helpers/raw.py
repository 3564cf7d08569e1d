"""Raw gRPC clients for tests that speak the contract directly: a bidi Session driven message by
message, the Open they start with, and a well-behaved device generating the whole time."""

from __future__ import annotations

import queue
import threading

from edgespec.v1 import speculative_pb2 as pb

from helpers import PROMPTS


class Session:
    """A raw bidi stream: send messages one by one, read replies (a 60 s deadline on the call)."""

    def __init__(self, stub, metadata: tuple = ()):
        self._requests: queue.Queue = queue.Queue()
        self._replies = stub.Session(iter(self._requests.get, None), metadata=metadata, timeout=60)

    def send(self, **kind) -> None:
        self._requests.put(pb.SessionRequest(**kind))

    def reply(self) -> pb.SessionResponse:
        return next(self._replies)

    def close(self) -> None:
        self._requests.put(None)
        self._replies.cancel()


def open_msg(info, **overrides) -> pb.Open:
    fields = dict(prompt_ids=[5, 6, 7], mode=pb.VERIFY_MODE_GREEDY, tokenizer_fingerprint=info.tokenizer_fingerprint)
    fields.update(overrides)
    return pb.Open(**fields)


def healthy_device(server, **client_options):
    """Starts a device generating PROMPTS[0] over and over on a thread; returns (stop, thread,
    results, errors): results are (prompt ids, output) pairs to check against the target."""
    from edgespec.edge.client import EdgeClient

    stop = threading.Event()
    results, errors = [], []

    def loop():
        try:
            with EdgeClient(server.address, server.pair.draft_dir, **client_options) as client:
                ids = client.encode(PROMPTS[0])
                while not stop.is_set():
                    results.append((ids, client.generate(ids, max_new_tokens=40, k=2, stop_token_ids=()).token_ids))
        except Exception as exc:  # surfaced by the module's last test
            errors.append(exc)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return stop, thread, results, errors


def check_healthy_device(healthy, target_model, *, min_results: int) -> None:
    """Stops a ``healthy_device`` and checks it: no error, at least ``min_results`` generations,
    each exactly the target's greedy output."""
    from helpers import reference_greedy

    stop, thread, results, errors = healthy
    stop.set()
    thread.join(timeout=120)
    assert not errors, errors
    assert len(results) >= min_results
    expected = reference_greedy(target_model, results[0][0], 40)
    assert all(tokens == expected for _, tokens in results)
