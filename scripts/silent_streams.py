"""Silent streams against a healthy session: N streams connect (with a valid key) and never
send, while one device generates the whole time; prints, per N, the device's longest gap
between committed tokens and the worst latency of a new Open from another client (opened, or
refused RESOURCE_EXHAUSTED) from a device with another key while the silent streams are held.

    .venv/bin/python scripts/silent_streams.py [--silent 60,100,200] [--hold-s 12] [--config '{"first_message_timeout_s": 10}']

Serves the tiny random pair (built in a temporary directory) on CPU, one thread each side,
HAProxy ingress, with the verifier's defaults unless --config overrides fields (JSON). The
silent streams come over several connections (an attacker is not bound by one connection's
100-stream HTTP/2 limit); the probe Opens come over a fresh connection each (another device).

On a machine where other Ray instances run, give this one its own replica ports (Serve draws
every instance's from 40000-41000 and 30000-31000, and a run can reach another's replica: its
device then fails with a tokenizer mismatch): RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT=44230
RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT=44330 (and the same for _HTTP_PORT, 34230-34330).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

KEY, HEALTHY_KEY, NEW_KEY = "es-silent-key", "es-healthy-key", "es-new-device-key"
STREAMS_PER_CONNECTION = 50


def keys_file(root: Path) -> Path:
    from edgespec.cloud.serving.auth import digest

    path = root / "keys.json"
    path.write_text(json.dumps({"keys": [{"id": "silent", "sha256": digest(KEY)}, {"id": "healthy", "sha256": digest(HEALTHY_KEY)},
                                         {"id": "new", "sha256": digest(NEW_KEY)}]}))
    return path


class HealthyDevice:
    """Generates over and over on its own thread; ``events`` are the perf_counter times of the
    start of each generation and of every piece it receives (its own clock)."""

    def __init__(self, address: str, draft_dir: Path):
        self.address, self.draft_dir = address, draft_dir
        self.events: list[float] = []
        self.outputs: list[list[int]] = []
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        from edgespec.edge.client import EdgeClient

        try:
            with EdgeClient(self.address, self.draft_dir, api_key=HEALTHY_KEY) as client:
                ids = client.encode("def main(argv=None):\n    parser = ")
                while not self.stop.is_set():
                    self.events.append(time.perf_counter())
                    with client.stream(ids, max_new_tokens=40, k=2, stop_token_ids=()) as stream:
                        for _ in stream:
                            self.events.append(time.perf_counter())
                    self.outputs.append(stream.token_ids)
        except Exception as exc:
            self.errors.append(exc)

    def longest_gap(self, start: float, end: float) -> float:
        times = [t for t in self.events if start <= t <= end]
        times = [start, *times, min(end, time.perf_counter())]
        return max(b - a for a, b in zip(times, times[1:]))


async def hold_silent(address: str, n: int, hold_s: float, ends: list) -> None:
    """Opens ``n`` Session streams that never send; each one's end (code, seconds) goes to ``ends``."""
    import grpc

    from edgespec.v1 import speculative_pb2_grpc as pb_grpc

    channels = [grpc.aio.insecure_channel(address) for _ in range(-(-n // STREAMS_PER_CONNECTION))]
    started = time.perf_counter()

    async def one(i: int) -> None:
        call = pb_grpc.SpeculativeStub(channels[i // STREAMS_PER_CONNECTION]).Session(
            metadata=(("authorization", f"Bearer {KEY}"),))
        try:
            await asyncio.wait_for(call.read(), hold_s)
            ends.append(("reply", time.perf_counter() - started, ""))
        except asyncio.TimeoutError:
            ends.append(("held", hold_s, ""))
            call.cancel()
        except grpc.aio.AioRpcError as exc:
            ends.append((exc.code().name, time.perf_counter() - started, exc.details()))

    await asyncio.gather(*(one(i) for i in range(n)))
    for channel in channels:
        await channel.close()


def probe_open(address: str, fingerprint: str) -> tuple[float, str]:
    """A new device's Open over a fresh connection: (seconds to its answer, the answer)."""
    import grpc

    from edgespec.v1 import speculative_pb2 as pb
    from edgespec.v1 import speculative_pb2_grpc as pb_grpc

    with grpc.insecure_channel(address) as channel:
        grpc.channel_ready_future(channel).result(timeout=10)
        open_msg = pb.SessionRequest(open=pb.Open(prompt_ids=[5, 6, 7], mode=pb.VERIFY_MODE_GREEDY,
                                                  tokenizer_fingerprint=fingerprint))
        close = pb.SessionRequest(close=pb.Close())
        started = time.perf_counter()
        replies = pb_grpc.SpeculativeStub(channel).Session(iter([open_msg, close]),
                                                           metadata=(("authorization", f"Bearer {NEW_KEY}"),), timeout=60)
        try:
            first = next(replies)
            answer = "opened" if first.HasField("opened") else first.WhichOneof("kind")
        except grpc.RpcError as exc:
            answer = f"{exc.code().name}: {exc.details()[:80]}"
        elapsed = time.perf_counter() - started
        replies.cancel()
        return elapsed, answer


def measure(address: str, device: HealthyDevice, fingerprint: str, n: int, hold_s: float) -> dict:
    ends: list = []
    attack = threading.Thread(target=lambda: asyncio.run(hold_silent(address, n, hold_s, ends)), daemon=True)
    start = time.perf_counter()
    attack.start()
    probes = []
    time.sleep(0.5)
    while time.perf_counter() - start < hold_s - 1.0:
        probes.append(probe_open(address, fingerprint))
        time.sleep(0.5)
    attack.join(timeout=hold_s + 30)
    end = time.perf_counter()
    worst = max(probes)
    outcomes: dict[str, int] = {}
    for code, _, _ in ends:
        outcomes[code] = outcomes.get(code, 0) + 1
    return {"silent": n, "healthy_longest_gap_s": round(device.longest_gap(start, end), 3),
            "new_open_worst_s": round(worst[0], 3), "new_open_answers": sorted({a for _, a in probes}),
            "probes": len(probes), "silent_stream_ends": outcomes,
            "first_silent_refusal": next((d for c, _, d in ends if c not in ("held", "reply")), "")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--silent", default="60,100,200", help="comma-separated counts of silent streams")
    parser.add_argument("--hold-s", type=float, default=12.0, help="how long each round holds its silent streams")
    parser.add_argument("--config", default="{}", help="VerifierConfig fields as JSON (default: the verifier's defaults)")
    parser.add_argument("--pair", type=Path, default=None, help="a directory to build (or reuse) the tiny pair in")
    parser.add_argument("--ingress", default="haproxy", choices=("haproxy", "proxy", "direct"), help="Serve's gRPC ingress")
    args = parser.parse_args()

    import torch

    from edgespec.cloud.serving.app import init_ray, serve_verifier, stop_serving
    from edgespec.cloud.serving.config import DeploymentOptions, VerifierConfig
    from edgespec.cloud.serving.haproxy_owner import free_port
    from edgespec.cloud.training.export import export_draft
    from edgespec.cloud.training.tiny import build_tiny_pair
    from edgespec.edge.client import EdgeClient

    torch.set_num_threads(1)
    root = args.pair or Path(tempfile.mkdtemp(prefix="edgespec-silent-"))
    pair = build_tiny_pair(root)  # reused when already there
    if not (root / "draft" / "manifest.json").is_file():
        export_draft(pair.draft_dir, root / "draft")
    target_dir = pair.target_dir
    overrides = json.loads(args.config)
    config = VerifierConfig(model=str(target_dir), device="cpu", api_keys_file=str(keys_file(root)), **overrides)
    init_ray(num_cpus=4, ingress=args.ingress)
    port = free_port()
    try:
        address = serve_verifier(config, DeploymentOptions(num_cpus=0.5), grpc_port=port, http_port=free_port())
        with EdgeClient(address, root / "draft", api_key=KEY) as client:
            fingerprint = client.draft.manifest.tokenizer_fingerprint
        device = HealthyDevice(address, root / "draft")
        device.thread.start()
        time.sleep(3.0)  # the device's first generations (its draft warms up)
        print(json.dumps({"config": {k: v for k, v in config.to_dict().items() if k in (
            "max_sessions", "first_message_timeout_s", "max_pending_streams", "max_pending_streams_per_key")},
            "ingress": args.ingress, "address": address, "load": os.getloadavg()}), flush=True)
        for n in (int(x) for x in args.silent.split(",")):
            quiet_gap = device.longest_gap(time.perf_counter() - 3.0, time.perf_counter())
            row = measure(address, device, fingerprint, n, args.hold_s)
            row["healthy_gap_before_s"] = round(quiet_gap, 3)
            row["load"] = [round(x, 1) for x in os.getloadavg()]
            print(json.dumps(row), flush=True)
            time.sleep(max(config.first_message_timeout_s, 3.0))  # what is left of the silent ones ends
        device.stop.set()
        device.thread.join(timeout=60)
        expected = device.outputs[0] if device.outputs else None
        print(json.dumps({"generations": len(device.outputs), "all_identical": all(o == expected for o in device.outputs),
                          "errors": [repr(e) for e in device.errors]}), flush=True)
    finally:
        stop_serving()
    return 0


if __name__ == "__main__":
    sys.exit(main())
