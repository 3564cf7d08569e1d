"""Running measurements through the real Serve gRPC path.

``Harness`` starts Ray and Serve with the target on this machine (or connects to a running
deployment with ``server=``) and runs prompts through an EdgeClient with the ONNX draft. Every
comparison alternates its arms prompt by prompt (and flips which arm goes first), so both see
the same machine load: the figures are ratios measured in one run.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from edgespec.cloud.bench.connection import connection_to
from edgespec.edge.client import EdgeClient
from edgespec.edge.stats import RequestStats

QUIET_S = 0.5  # between measurements on an emulated link: this long with nothing on it
QUIET_TIMEOUT_S = 10.0  # (a link that never goes quiet, e.g. someone else's traffic: go on)
# GenerationParams fields that only speculation reads; a cloud-only arm leaves them out.
SPECULATION_ONLY = ("k", "mode", "top_n", "lookup", "lookup_weight", "draft_temperature", "send_ahead", "tree", "speculate")
from edgespec.edge.types import Result


def load_prompts(path: str | Path, limit: int | None = None, *, chat_template: str | None = None) -> list[str]:
    """Prompts from a JSONL file (``prompt`` or ``text`` field) or a text file (blank-line separated).

    ``chat_template`` (the draft's, ``edge.eos.chat_template_of``): a record with ``messages``
    is rendered with it, as the device server renders a chat request, so a chat model is timed
    on what its users send it (without it, the record's ``prompt`` as plain text)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompt file {path} not found")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        from edgespec.edge.openai_request import RequestError, render_chat

        prompts = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            record = json.loads(line)
            if chat_template is not None and "messages" in record:
                try:
                    prompts.append(render_chat(chat_template, record["messages"]))
                except RequestError as exc:
                    raise ValueError(f"{path}:{number}: {exc}") from None
                continue
            prompt = record.get("prompt") or record.get("text")
            if not prompt:
                raise ValueError(f"{path}:{number}: a record needs a 'prompt' or 'text' field")
            prompts.append(prompt)
    else:
        prompts = [block for block in text.split("\n\n") if block.strip()]
    if not prompts:
        raise ValueError(f"{path} holds no prompts")
    return prompts[:limit] if limit else prompts


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Summary:
    """Aggregate of several generations with the same settings."""

    generations: int
    tokens: int
    ms_per_token: float
    tau: float
    acceptance_rate: float
    acceptance_by_position: list[float]
    draft_ms_per_token: float
    wait_ms_per_round: float
    bytes_per_round: float
    mean_k: float
    rounds: int
    batch_size_mean: float

    @classmethod
    def of(cls, results: list[Result]) -> "Summary":
        stats = [r.stats for r in results]
        tokens = sum(s.generated for s in stats)
        rounds = sum(s.rounds for s in stats)
        drafted = sum(s.drafted for s in stats)
        accepted = sum(s.accepted for s in stats)
        positions = max((len(s.drafted_at) for s in stats), default=0)
        by_position = []
        for i in range(positions):
            sent = sum(s.drafted_at[i] for s in stats if i < len(s.drafted_at))
            ok = sum(s.accepted_at[i] for s in stats if i < len(s.accepted_at))
            by_position.append(ok / sent if sent else 0.0)
        batches = [b for s in stats for b in s.server_batch_sizes]
        return cls(
            generations=len(results),
            tokens=tokens,
            ms_per_token=1000.0 * sum(s.wall_s for s in stats) / tokens if tokens else 0.0,
            tau=(accepted + rounds) / rounds if rounds else 1.0,
            acceptance_rate=accepted / drafted if drafted else 0.0,
            acceptance_by_position=by_position,
            draft_ms_per_token=RequestStats.combined(stats).draft_ms_per_token,
            wait_ms_per_round=1000.0 * sum(s.wait_s for s in stats) / rounds if rounds else 0.0,
            bytes_per_round=sum(s.bytes_sent + s.bytes_received for s in stats) / rounds if rounds else 0.0,
            mean_k=drafted / rounds if rounds else 0.0,
            rounds=rounds,
            batch_size_mean=statistics.mean(batches) if batches else 0.0,
        )

    def to_dict(self) -> dict:
        return asdict(self)


# The verifier's engine for the Serve a bench starts (``edgespec bench --backend``): read from the
# environment so that modes which run their arms in child processes start the same one.
BACKEND_ENV = "EDGESPEC_BENCH_BACKEND"

class Harness:
    """A target served by Ray Serve and a client with the ONNX draft, for measurements."""

    def __init__(
        self,
        target: Path,
        draft: Path,
        *,
        server: str | None = None,
        progress: Callable[[str], None] = print,
        torch_threads: int = 1,
        draft_threads: int = 1,
        max_sessions: int = 64,
        ingress: str | None = None,
        replicas: int = 1,
    ):
        self.target, self.draft, self.progress = Path(target), Path(draft), progress
        self.started_serve = server is None
        if server is None:
            server = self._start_serve(torch_threads, max_sessions, ingress, replicas)
        self.server = server
        self.draft_threads = draft_threads
        self.link = None
        self.client = EdgeClient(server, draft, draft_threads=draft_threads, timeout=120, **self._connection())
        self.info = self.client.info()

    @property
    def address(self) -> str:
        """Where clients connect: the server, or the link emulator in front of it."""
        return self.link.address if self.link else self.server

    def use_link(self, profile) -> None:
        """Routes every following measurement through an emulated link (None: direct)."""
        from edgespec.cloud.link.emulator import LinkEmulator

        self.client.close()
        if self.link:
            self.link.close()
            self.link = None
        if profile is not None:
            self.link = LinkEmulator(self.server, profile)
            self.link.start()
        self.client = EdgeClient(self.address, self.draft, draft_threads=self.draft_threads, timeout=120, **self._connection())

    def pair_draws(self, key: str) -> None:
        """The link's random draws (jitter, loss) restart from ``key`` (nothing without a link):
        arms run on one text after the same key meet the same draws (``LinkEmulator.reseed``).
        First the link goes quiet: a generation returns with replies still on their way (a block
        sent ahead, its session's close). On satellite they trail it by up to 1.5 s. Left
        in flight, they took the next arm's first draws and could hold its first bytes behind a
        loss of theirs (an 800 ms retransmission charged to the arm that came next)."""
        if self.link is not None:
            self.link.wait_quiet(QUIET_S, QUIET_TIMEOUT_S)
            self.link.reseed(key)

    def _start_serve(self, torch_threads: int, max_sessions: int, ingress: str | None, replicas: int) -> str:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        from edgespec.cloud.serving.app import init_ray, serve_verifier
        from edgespec.cloud.serving.config import DeploymentOptions, VerifierConfig

        self.progress(f"starting Ray Serve with {self.target} (CPU, {torch_threads} thread(s), "
                      f"{os.environ.get(BACKEND_ENV, 'transformers')} backend) ...")
        started = time.perf_counter()
        # The replicas' logs stay in Ray's log folder (/tmp/ray/session_latest/logs), off this terminal.
        init_ray(num_cpus=max(2, os.cpu_count() or 2), ingress=ingress, log_to_driver=False)
        port = free_port()
        backend = os.environ.get(BACKEND_ENV, "transformers")
        config = VerifierConfig(
            model=str(self.target), device="cpu", torch_threads=torch_threads, max_sessions=max_sessions,
            max_batch_size=max_sessions, max_new_tokens=8192, backend=backend,
        )
        options = DeploymentOptions(num_cpus=1 if replicas == 1 else 0.5, num_replicas=replicas)
        address = serve_verifier(config, options, grpc_port=port, http_port=free_port(), timeout_s=600)
        self.progress(f"serving on {address} after {time.perf_counter() - started:.0f}s")
        return address

    def close(self) -> None:
        self.client.close()
        if self.link:
            self.link.close()
        if self.started_serve:
            # Ray down, then its HAProxy: seconds, no "Controller failed to shut down" (Serve's
            # own shutdown waits 30 s on HAProxy's controller).
            from edgespec.cloud.serving.app import stop_serving

            stop_serving()

    def __enter__(self) -> "Harness":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def warm_up(self, prompt: str) -> None:
        self.client.generate(prompt, max_new_tokens=16, k=4)
        self.client.generate_cloud(prompt, max_new_tokens=16)

    def new_client(self) -> EdgeClient:
        """A client of its own (its own planner, starting from nothing measured), for an arm whose
        figures must not steer or be steered by another arm's (the caller closes it)."""
        return EdgeClient(self.address, self.draft, draft_threads=self.draft_threads, timeout=120, **self._connection())

    def _connection(self) -> dict:
        """The server's API key and TLS (``connection.py``); through a link emulator too."""
        return connection_to(self.server).client_options()

    def speculative(self, prompt: str, params: dict) -> Result:
        return self.client.generate(prompt, **params)

    def cloud_only(self, prompt: str, params: dict) -> Result:
        cloud_params = {k: v for k, v in params.items() if k not in SPECULATION_ONLY}
        return self.client.generate_cloud(prompt, **cloud_params)

    def compare(self, prompts: list[str], params: dict, label: str = "") -> tuple[list[Result], list[Result]]:
        """Speculative vs cloud-only on the same prompts and seeds, alternating arm order; on an
        emulated link both arms' run of a text start from the same draws (``pair_draws``)."""
        spec, cloud = [], []
        for i, prompt in enumerate(prompts):
            arms = [(spec, self.speculative), (cloud, self.cloud_only)]
            for results, run in arms if i % 2 == 0 else arms[::-1]:
                self.pair_draws(f"{label}/prompt {i}")
                results.append(run(prompt, params))
            self.progress(f"  {label} prompt {i + 1}/{len(prompts)}")
        return spec, cloud

    def run(self, prompts: list[str], params: dict, label: str = "") -> list[Result]:
        out = []
        for i, prompt in enumerate(prompts):
            out.append(self.speculative(prompt, params))
            self.progress(f"  {label} prompt {i + 1}/{len(prompts)}")
        return out


def shown(path) -> str:
    """A path as the reader would type it: relative to the working directory when inside it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def switch_log(result) -> list[dict]:
    """The planner's decisions of one request, as dicts (``planner.Switch``): from the result's
    stats when they carry them (``switch_log``), else none."""
    log = getattr(getattr(result, "stats", None), "switch_log", None) or getattr(result, "switch_log", None) or []
    return [dict(entry) if isinstance(entry, dict) else asdict(entry) for entry in log]
