"""Calibrating the fleet simulator from measurements of this pair on this machine.

- verification time: the replica's own engine timed in-process over a grid of (batch size,
  tokens per row), each row with a realistic context;
- draft ms/token, acceptance at each position, message sizes: a greedy loopback run of the
  real client at k = k_max through the Serve gRPC path;
- the ingress (proxy and replica I/O, a queue shared by the replica's sessions; see
  ``edgespec.cloud.simulate.calibration``), from single sessions only: per round message, half
  of that run's send -> verdict time minus the forward time; per streamed message, the steady
  cloud-only ms/token (after the first token) minus one decode step. All of that overhead is
  taken to be queueing CPU work (non-queueing remainders 0).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from edgespec.cloud.bench.diagnosis import Diagnosis
from edgespec.cloud.bench.harness import Harness, Summary, shown
from edgespec.cloud.serving.config import VerifierConfig
from edgespec.cloud.serving.engine import TargetEngine
from edgespec.cloud.simulate.calibration import Calibration, VerifyModel

BATCHES = (1, 2, 4, 8, 16, 32)
TOKENS_PER_ROW = (1, 3, 5, 9)


def time_verify_table(
    target: Path, context: int = 256, repeats: int = 5, batches=BATCHES, tokens=TOKENS_PER_ROW
) -> tuple[VerifyModel, float]:
    """Median ms of one engine forward for each (batch, tokens per row), contexts of ``context``;
    and the ms of prefilling one such context."""
    torch.set_num_threads(1)
    engine = TargetEngine(VerifierConfig(model=str(target), device="cpu", torch_threads=1))
    generator = torch.Generator().manual_seed(0)
    sessions, prefill_ms = [], []
    for _ in range(max(batches)):
        kv = engine.new_kv()
        started = time.perf_counter()
        engine.prefill(kv, torch.randint(0, engine.vocab_size, (context,), generator=generator).tolist())
        prefill_ms.append((time.perf_counter() - started) * 1000)
        sessions.append(kv)
    table = []
    for batch in batches:
        row = []
        for n in tokens:
            samples = []
            for _ in range(repeats):
                rows = [(kv, torch.randint(0, engine.vocab_size, (n,), generator=generator).tolist()) for kv in sessions[:batch]]
                started = time.perf_counter()
                engine.forward(rows)
                samples.append((time.perf_counter() - started) * 1000)
                for kv in sessions[:batch]:
                    engine.trim(kv, context)
            row.append(statistics.median(samples))
        table.append(row)
    model = VerifyModel(batch=tuple(batches), tokens_per_row=tuple(tokens), ms=tuple(tuple(r) for r in table))
    return model, statistics.median(prefill_ms)


def calibrate(
    harness: Harness,
    prompts: list[str],
    verify: VerifyModel,
    prefill_ms: float,
    *,
    k: int = 8,
    max_new_tokens: int = 64,
    progress=print,
) -> Calibration:
    # One block in flight: the simulator models rounds one after another (no send-ahead).
    params = dict(max_new_tokens=max_new_tokens, k=k, send_ahead=1, stop_token_ids=())
    spec = harness.run(prompts, params, "calibration (speculative)")
    cloud = [harness.cloud_only(p, params) for p in prompts]
    diagnosis = Diagnosis()
    decode = lambda ids: harness.client.draft.tokenizer.decode(ids)  # noqa: E731
    for result in spec:
        diagnosis.add(decode, result.prompt_ids, result.token_ids, result.rounds)
    by_position = diagnosis.by_position()
    acceptance = tuple(by_position.get(i, 0.0) for i in range(1, k + 1))
    rounds = [r for result in spec for r in result.rounds]
    server_ms = [verify(1, r.k + 1) for r in rounds]
    round_overhead = max(statistics.median(r.wait_ms - s for r, s in zip(rounds, server_ms)), 0.0)
    cloud_summary = Summary.of(cloud)
    # Steady state: the first token also carries the request and the prefill.
    steady = [
        1000.0 * (c.stats.wall_s - c.stats.first_token_s) / (c.stats.generated - 1) for c in cloud if c.stats.generated > 1
    ]
    cloud_ms_per_token = statistics.median(steady) if steady else cloud_summary.ms_per_token
    stream_message_ms = max(cloud_ms_per_token - verify(1, 1), 0.0)
    spec_summary = Summary.of(spec)
    rounds_total = max(spec_summary.rounds, 1)
    up_per_round = sum(s.stats.bytes_sent for s in spec) / rounds_total
    down_per_round = sum(s.stats.bytes_received for s in spec) / rounds_total
    down_per_token = sum(c.stats.bytes_received for c in cloud) / max(cloud_summary.tokens, 1)
    progress(f"  calibration: draft {spec_summary.draft_ms_per_token:.2f} ms/token, round overhead {round_overhead:.2f} ms "
             f"(ingress {round_overhead / 2:.2f} ms/message), stream ingress {stream_message_ms:.2f} ms/message, "
             f"acceptance by position {[round(a, 2) for a in acceptance]}")
    return Calibration(
        source=f"measured on this machine: target {shown(harness.target)}, draft {shown(harness.draft)}, loopback, {len(prompts)} prompts",
        draft_ms_per_token=spec_summary.draft_ms_per_token,
        draft_cv=0.1,
        acceptance=acceptance,
        verify=verify,
        ingress_ms_per_round_message=round_overhead / 2,  # Draft in, Verdict out
        ingress_ms_per_stream_message=stream_message_ms,
        round_overhead_ms=0.0,
        stream_overhead_ms=0.0,
        prefill_ms=prefill_ms,
        # Payload + gRPC framing as counted by the client; HTTP/2 frame headers add ~9 B each.
        up_bytes_base=max(int(up_per_round - 2 * spec_summary.mean_k), 1),
        up_bytes_per_draft=2,
        down_bytes_per_round=max(int(down_per_round), 1),
        open_bytes=400,
        down_bytes_per_token=max(int(down_per_token), 1),
    )
