"""The GPU check behind ``scripts/gpu_check.sh``: serve real targets on CUDA in bf16 through the
real Serve gRPC path, on both verifier backends; check greedy, print throughput and memory.

Terms: *speculative* is a Session of draft rounds; *cloud-only* is a Generate stream (the
backend's own decoding: the replica's batched steps on transformers, vLLM's streaming decode on
vllm); *idle* sessions are open and waiting for their device, sending nothing.

1. targets: the demo target (``models/demo/target``) and a ~1B-parameter random Llama built on
   the GPU (``random_llama``: default init, a wide output layer so that greedy argmax ties are
   rare; saved in bf16 with the demo tokenizer); per target, ``generate()``'s greedy text for
   --prompts random prompts in bf16 on the GPU (its model stays loaded to check ties);
2. per target, per backend (``--backends``, default both; vllm is skipped with a printed line,
   and exit code 3, where ``import vllm`` fails): one replica (one GPU, dtype auto = bf16):
   - greedy: the prompts cloud-only, then as speculative sessions at once with drafts half
     right (two of the cloud-only text's next tokens, two wrong ones: accept, reject and
     rollback every round). Speculative == cloud-only token for token: one engine, so any
     divergence fails (whether ``generate()``'s logits are a bf16 near tie there is printed, to
     read it). Speculative vs ``generate()``: a divergence where ``generate()``'s own top-two
     logits are within bf16 resolution (``near_tie``) is a tie, not a mismatch: two correct
     bf16 kernels may round such a pair either way; any other divergence fails;
   - tokens/s at 1, 16 and 64 sessions, speculative (k random drafts a round: verified
     positions/s, the ceiling at full acceptance, and committed tokens/s, the floor at none)
     and cloud-only (Generate streams); the replica's step time by batch size (transformers)
     or the round's latency (vllm: each round is its own engine request);
   - memory held per waiting session: --idle-sessions open and idle against none. transformers:
     the KV bytes admission reserved (pinned until Close); vllm: the engine's KV blocks in use
     (``vllm:kv_cache_usage_perc`` in the replica's Prometheus registry: their prompts stay in
     the prefix cache, evictable, so ~0 is pinned); both: device memory in use (the KV spaces
     are preallocated, so it should not move). A figure that cannot be read is said so;
3. vllm with --tensor-parallel-size 2 on the largest target where two GPUs are visible: greedy
   and tokens/s at 16 sessions; skipped with a printed line otherwise.

Each replica's start and each check's end print their times. Sized for ~10 minutes on one H100
(not yet run on one): the engines' starts dominate (vLLM compiles and captures CUDA graphs);
each check's own work is seconds to tens of seconds.

Exit code 1 on any mismatch or failure, 3 where a requested backend was skipped, else 0.
``--plan`` prints the steps and exits (no GPU needed). Needs ``make setup`` (torch with CUDA on
the GPU host; vllm==0.29.0 for the vllm backend).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
NO_CUDA = "gpu_check: no CUDA device (torch.cuda.is_available() is False): run it on a machine with an NVIDIA GPU"
BACKENDS = ("transformers", "vllm")
SKIPPED = 3  # exit code: no mismatch, but a requested backend did not run


def parse_backends(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    unknown = [name for name in names if name not in BACKENDS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"backends are a comma-separated subset of {','.join(BACKENDS)}, got {text!r}")
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpu_check.sh", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", type=parse_backends, default=BACKENDS, help="transformers,vllm (default both)")
    parser.add_argument("--demo-target", type=Path, default=REPO / "models" / "demo" / "target")
    parser.add_argument("--layers", type=int, default=20, help="random Llama: layers (20 x 2048 wide: ~1.0B parameters)")
    parser.add_argument("--hidden", type=int, default=2048, help="random Llama: width")
    parser.add_argument("--sessions", default="1,16,64", help="throughput: concurrent sessions (and cloud-only streams)")
    parser.add_argument("--rounds", type=int, default=40, help="throughput: speculative rounds per session")
    parser.add_argument("--generate-tokens", type=int, default=128, help="throughput: tokens per cloud-only stream")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=8, help="greedy check: sessions verified together")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="greedy check: tokens per session")
    parser.add_argument("--idle-sessions", type=int, default=64, help="memory: sessions open and idle")
    parser.add_argument("--idle-tokens", type=int, default=256, help="memory: prompt and max_new_tokens of each idle session")
    parser.add_argument("--tensor-parallel-size", type=int, default=2, help="the vllm TP run's size (1: no TP run)")
    parser.add_argument("--vllm-memory", type=float, default=0.5,
                        help="vllm's gpu_memory_utilization (room is left for generate()'s model in this process)")
    parser.add_argument("--skip-random", action="store_true", help="only the demo target")
    parser.add_argument("--plan", action="store_true", help="print the steps and exit (no GPU needed)")
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: a smoke run of this script's own logic
    parser.add_argument("--work", type=Path, default=None, help="where the random model is written (default a temp dir)")
    return parser.parse_args(argv)


def counts(args) -> list[int]:
    return [int(n) for n in args.sessions.split(",")]


def plan(args, gpus: int, vllm_error: str | None) -> list[str]:
    """The run's steps, as printed first (and alone with --plan)."""
    backends = [b for b in args.backends if b != "vllm" or vllm_error is None]
    targets = ["demo"] + ([] if args.skip_random else [f"llama-1b (random, {args.layers} x {args.hidden})"])
    lines = [f"plan: backends {', '.join(args.backends)}; targets {', '.join(targets)}; {gpus} GPU(s) visible"]
    if vllm_error is not None and "vllm" in args.backends:
        lines.append(f"  vllm: SKIPPED: import vllm failed ({vllm_error}); install vllm==0.29.0 to check it")
    where = "one GPU, bf16" if args.device == "cuda" else f"{args.device}, float32"
    lines += [f"  1. per target: generate()'s greedy text, {args.prompts} prompts x {args.max_new_tokens} tokens",
              f"  2. per target, per backend ({', '.join(backends) or 'none'}): one replica, {where}:",
              f"     a. greedy: {args.prompts} cloud-only streams, then {args.prompts} speculative sessions (half-right drafts): "
              f"== cloud-only token for token, == generate() up to bf16 ties",
              f"     b. tokens/s at {args.sessions} sessions: speculative ({args.rounds} rounds, k={args.k} random drafts) "
              f"and cloud-only ({args.generate_tokens} tokens a stream)",
              f"     c. memory: {args.idle_sessions} sessions open and idle vs none"]
    if "vllm" in backends and args.tensor_parallel_size > 1:
        tp = args.tensor_parallel_size
        lines.append(f"  3. vllm TP {tp} on the largest target: greedy, tokens/s at 16 sessions" if gpus >= tp
                     else f"  3. vllm TP {tp}: skipped: {gpus} GPU(s) visible, it needs {tp}")
    return lines


def vllm_import_error() -> str | None:
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install failing as it loads
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None


def random_llama(out: Path, tokenizer_from: Path, layers: int, hidden: int, device: str = "cuda") -> Path:
    """A random Llama of ``layers`` x ``hidden`` built on ``device`` in bf16 (the demo tokenizer)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab = int(json.loads((tokenizer_from / "config.json").read_text())["vocab_size"])  # the demo target's
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=int(hidden * 2.75), num_hidden_layers=layers,
                         num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 256), head_dim=64,
                         max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                         pad_token_id=0)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    with torch.no_grad():  # NOTE: peaked logits keep bf16 argmax ties rare (the check counts the rest)
        model.lm_head.weight.normal_(0.0, 0.35)
    model.save_pretrained(str(out))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (tokenizer_from / name).is_file():
            shutil.copy(tokenizer_from / name, out / name)
    params = sum(p.numel() for p in model.parameters())
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    print(f"random Llama: {layers} layers x {hidden} wide, {params / 1e9:.2f}B parameters, vocab {vocab}", flush=True)
    return out


def near_tie(logits, expected: int, got: int) -> bool:
    """``generate()``'s logits put ``expected`` and ``got`` within bf16 resolution of each other."""
    a, b = float(logits[expected]), float(logits[got])
    return abs(a - b) <= 4 * 2 ** -8 * max(abs(a), abs(b), 1.0)


def references(path: Path, prompts: list[list[int]], new_tokens: int, device: str):
    """Greedy continuations by ``generate()`` (the serving dtype: bf16 on cuda) and the model, for tie checks."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device).eval()
    out = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt], device=device)
            generated = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                                       pad_token_id=0)  # may stop early at EOS: the session gets the same length
            out.append(generated[0, len(prompt):].tolist())
    return model, out


def compare(label: str, prompts, expected, served, model, device: str, *, ties_ok: bool) -> tuple[int, int]:
    """(mismatches, ties) of ``served`` against ``expected``; each divergence is printed."""
    import torch

    mismatches = ties = 0
    for prompt, ref, got in zip(prompts, expected, served):
        first = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), None)
        if first is None:
            if len(got) != len(ref):
                mismatches += 1
                print(f"  MISMATCH {label}: {len(got)} tokens served, {len(ref)} expected")
            continue
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([prompt + ref[:first]], device=device)).logits[0, -1].float()
        tie = near_tie(logits, ref[first], got[first])
        said = f"token {first}: expected {ref[first]}, served {got[first]}, generate()'s logits " \
               f"{float(logits[ref[first]]):.4f} vs {float(logits[got[first]]):.4f}"
        if tie and ties_ok:
            ties += 1
            print(f"  tie {label}: {said} (bf16 resolution)")
        else:
            mismatches += 1
            print(f"  MISMATCH {label}: {said}{' (a bf16 near tie, but one engine must agree with itself)' if tie else ''}")
    return mismatches, ties


# ---- what a device and a cloud-only client send ------------------------------------------------

async def open_session(stub, pb, info, prompt: list[int], max_new_tokens: int):
    call = stub.Session()
    await call.write(pb.SessionRequest(open=pb.Open(prompt_ids=prompt, mode=pb.VERIFY_MODE_GREEDY, max_new_tokens=max_new_tokens,
                                                    tokenizer_fingerprint=info.tokenizer_fingerprint)))
    opened = await call.read()
    if not opened.HasField("opened"):
        raise RuntimeError(f"open refused: {opened}")
    return call


async def close_session(call, pb) -> None:
    await call.write(pb.SessionRequest(close=pb.Close()))
    await call.done_writing()


async def greedy_session(stub, pb, info, prompt: list[int], reference: list[int]) -> list[int]:
    """Drafts two of the reference's next tokens and two wrong ones per round; returns the committed tokens."""
    call = await open_session(stub, pb, info, prompt, len(reference))
    committed: list[int] = []
    for round_no in range(len(reference) + 1):
        done = len(committed)
        right = reference[done : done + 2]
        drafts = right + [(t + 1) % info.vocab_size for t in reference[done + 2 : done + 4]] or [1]
        await call.write(pb.SessionRequest(draft=pb.Draft(round=round_no, token_ids=drafts)))
        verdict = (await call.read()).verdict
        committed += list(drafts[: verdict.accepted]) + [verdict.next_token]
        if verdict.finished:
            break
    await close_session(call, pb)
    return committed


async def cloud_only(stub, pb, info, prompt: list[int], tokens: int) -> list[int]:
    out: list[int] = []
    request = pb.GenerateRequest(prompt_ids=prompt, max_new_tokens=tokens, tokenizer_fingerprint=info.tokenizer_fingerprint)
    async for reply in stub.Generate(request):
        out += reply.token_ids
    return out


async def raw_session(stub, pb, info, k: int, rounds: int, seed: int, out: dict) -> None:
    rng = random.Random(seed)
    call = await open_session(stub, pb, info, [rng.randrange(1, info.vocab_size) for _ in range(32)], rounds * (k + 1))
    for round_no in range(rounds):
        drafts = [rng.randrange(1, info.vocab_size) for _ in range(k)]
        sent = time.perf_counter()
        await call.write(pb.SessionRequest(draft=pb.Draft(round=round_no, token_ids=drafts)))
        verdict = (await call.read()).verdict
        out["round_ms"].append((time.perf_counter() - sent) * 1000)
        out["verified"] += k + 1
        out["committed"] += verdict.accepted + 1
        out["steps"][verdict.batch_size].append(verdict.verify_ms)
        if verdict.finished:
            break
    await close_session(call, pb)


# ---- one served target ---------------------------------------------------------------------------

async def check_greedy(label: str, stub, pb, info, prompts, refs, model, args) -> int:
    cloud = await asyncio.gather(*(cloud_only(stub, pb, info, p, len(r)) for p, r in zip(prompts, refs)))
    served = await asyncio.gather(*(greedy_session(stub, pb, info, p, c) for p, c in zip(prompts, cloud)))
    same, _ = compare(f"{label} speculative vs cloud-only", prompts, cloud, served, model, args.device, ties_ok=False)
    print(f"{label}: speculative == cloud-only (same replica) {'OK' if not same else 'FAILED'}: {len(prompts)} sessions x "
          f"{args.max_new_tokens} tokens, {same} mismatch(es)", flush=True)
    hf, ties = compare(f"{label} vs generate()", prompts, refs, served, model, args.device, ties_ok=True)
    print(f"{label}: speculative == generate() {'OK' if not hf else 'FAILED'}: {hf} mismatch(es), {ties} bf16 tie(s)", flush=True)
    return same + hf


async def throughput(label: str, stub, pb, info, backend: str, sessions: list[int], args) -> None:
    steps: dict[int, list[float]] = defaultdict(list)
    for count in sessions:
        spec = {"verified": 0, "committed": 0, "steps": steps, "round_ms": []}
        started = time.perf_counter()
        await asyncio.gather(*(raw_session(stub, pb, info, args.k, args.rounds, s, spec) for s in range(count)))
        spec_s = time.perf_counter() - started
        rng = random.Random(count)
        prompts = [[rng.randrange(1, info.vocab_size) for _ in range(32)] for _ in range(count)]
        started = time.perf_counter()
        streams = await asyncio.gather(*(cloud_only(stub, pb, info, p, args.generate_tokens) for p in prompts))
        cloud_s = time.perf_counter() - started
        tokens = sum(len(s) for s in streams)
        print(f"{label}: {count:3d} sessions  speculative: verified {spec['verified'] / spec_s:8.0f} tokens/s, committed "
              f"{spec['committed'] / spec_s:7.0f} tokens/s, round {statistics.median(spec['round_ms']):6.1f} ms  |  cloud-only: "
              f"{tokens / cloud_s:7.0f} tokens/s, {cloud_s * 1000 / args.generate_tokens:6.1f} ms/token a stream", flush=True)
    if backend == "transformers":
        print(f"{label}: step time (forward + accept) by batch size:")
        for size in sorted(steps):
            print(f"  batch {size:3d}: median {statistics.median(steps[size]):7.2f} ms over {len(steps[size])} rows")
    else:  # each round is its own engine request: there is no batch of the replica's to time
        rows = sorted(v for values in steps.values() for v in values)
        print(f"{label}: a round in the replica (one vLLM request, sharing engine steps): median "
              f"{statistics.median(rows):.2f} ms, p90 {rows[int(0.9 * (len(rows) - 1))]:.2f} ms over {len(rows)} rounds")


async def idle_memory(label: str, stub, pb, info, backend: str, args) -> None:
    """Memory held by --idle-sessions sessions open and waiting for their device, against none."""
    import ray

    size = max(1, min(args.idle_tokens, (info.max_context - info.max_k - 1) // 2))
    rng = random.Random(7)
    before, device_before = _holdings(ray), _device_used(args.device)
    calls = await asyncio.gather(*(open_session(stub, pb, info, [rng.randrange(1, info.vocab_size) for _ in range(size)], size)
                                   for _ in range(args.idle_sessions)))
    await asyncio.sleep(1.0)  # the engine's last step reports its stats
    during, device_during = _holdings(ray), _device_used(args.device)
    live = await _peak_while_decoding(ray, stub, pb, info, size) if backend == "vllm" else None
    await asyncio.gather(*(close_session(call, pb) for call in calls))
    n = args.idle_sessions
    what = f"{label}: {n} idle sessions (prompt {size}, max_new_tokens {size})"
    if backend == "transformers" and "kv_reserved_bytes" in during:
        each = (during["kv_reserved_bytes"] - before.get("kv_reserved_bytes", 0)) / n
        print(f"{what}: KV reserved {each / 2**20:.2f} MiB a session, pinned until Close ({info.kv_bytes_per_token} B/token, "
              f"whole pages of prompt + max_new_tokens + a round; {n * each / 2**20:.0f} MiB for all)")
    elif backend == "transformers":
        print(f"{what}: KV reserved: not measurable (the replica's admission could not be read: {during.get('error')})")
    elif "vllm_kv_usage" in during and during.get("vllm_blocks") and live:
        blocks, page = during["vllm_blocks"], during.get("page_tokens") or 0
        held = round((during["vllm_kv_usage"] - before.get("vllm_kv_usage", 0.0)) * blocks)
        print(f"{what}: vLLM KV blocks in use {round(during['vllm_kv_usage'] * blocks)} of {blocks} (none open: "
              f"{round(before.get('vllm_kv_usage', 0.0) * blocks)}; while one stream decodes: {round(live * blocks)}): "
              f"{held * page * info.kv_bytes_per_token / n / 2**20:.2f} MiB pinned a session; their prompts stay in the "
              f"prefix cache, evictable (vLLM reports no count of cached blocks)")
    else:
        why = during.get("error") or ("vllm:kv_cache_usage_perc did not move while a stream decoded" if "vllm_kv_usage" in during
                                      else "no vllm:kv_cache_usage_perc / cache_config_info in the replica's Prometheus registry")
        print(f"{what}: vLLM KV blocks in use: not measurable ({why})")
    if device_before is None or device_during is None:
        print(f"{what}: device memory: not measured ({args.device} run)")
    else:
        print(f"{what}: device memory in use {device_during / 2**30:.2f} GiB, {(device_during - device_before) / 2**20:+.0f} MiB "
              f"against none (KV space preallocated: the sessions' share is the figure above)")


async def _peak_while_decoding(ray, stub, pb, info, size: int) -> float:
    """vLLM's KV usage at its highest while one cloud-only stream decodes: 0 means the gauge is not live."""
    rng = random.Random(8)
    stream = asyncio.ensure_future(cloud_only(stub, pb, info, [rng.randrange(1, info.vocab_size) for _ in range(size)], size))
    peak = 0.0
    while not stream.done():
        held = await asyncio.to_thread(_holdings, ray)
        peak = max(peak, held.get("vllm_kv_usage", 0.0))
        await asyncio.sleep(0.02)
    await stream
    return peak


def _device_used(device: str) -> int | None:
    """Bytes in use on every visible GPU, by any process (None on a CPU run)."""
    if device != "cuda":
        return None
    import torch

    used = 0
    for index in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(index)
        used += total - free
    return used


def _holdings(ray) -> dict:
    """What the one verifier replica holds now (``replica_holdings``, run in it by ``__ray_call__``)."""
    replicas = [a for a in ray.util.list_named_actors(all_namespaces=True)
                if a["name"].startswith("SERVE_REPLICA::") and "Verifier" in a["name"]]
    if len(replicas) != 1:
        return {"error": f"{len(replicas)} verifier replicas"}
    try:
        actor = ray.get_actor(replicas[0]["name"], namespace=replicas[0]["namespace"])
        return ray.get(actor.__ray_call__.remote(replica_holdings), timeout=60)
    except Exception as exc:  # reported as "not measurable", with why
        return {"error": f"{type(exc).__name__}: {exc}"}


def replica_holdings(actor) -> dict:
    """Runs inside the replica's actor: admission's counts, and vLLM's KV usage from its Prometheus registry."""
    held: dict = {}
    # NOTE: Serve keeps the deployment instance private (Ray 2.60's attributes); a miss is reported, not guessed.
    wrapper = getattr(getattr(actor, "_replica_impl", None), "_user_callable_wrapper", None)
    deployment = getattr(wrapper, "_callable", None)
    if deployment is not None and type(deployment).__name__ == "VerifierDeployment":
        held.update(sessions=deployment.admission.active, kv_reserved_bytes=deployment.admission.reserved_bytes,
                    page_tokens=deployment.verifier.backend.info.kv_page_tokens)
    else:
        held["error"] = "the replica's VerifierDeployment is not where Ray 2.60 keeps it"
    if "vllm" in sys.modules:
        from prometheus_client import REGISTRY

        for metric in REGISTRY.collect():
            for sample in metric.samples:
                if sample.name == "vllm:kv_cache_usage_perc":
                    held["vllm_kv_usage"] = float(sample.value)
                elif sample.name == "vllm:cache_config_info" and str(sample.labels.get("num_gpu_blocks", "")).isdigit():
                    held["vllm_blocks"] = int(sample.labels["num_gpu_blocks"])
    return held


async def check_target(label: str, backend: str, path: Path, address: str, refs, args, *, sessions: list[int],
                       memory: bool = True) -> int:
    """Greedy check, throughput and memory of one served target; returns the number of mismatches."""
    import grpc  # here, not at the top: the device check imports this module's models on machines without gRPC

    from edgespec.v1 import speculative_pb2 as pb
    from edgespec.v1 import speculative_pb2_grpc as pb_grpc

    prompts, expected, model = refs
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.SpeculativeStub(channel)
        info = await stub.Info(pb.InfoRequest(), timeout=60)
        if info.model_id != path.name:
            raise RuntimeError(f"{address} serves {info.model_id!r}, not {path.name!r}")
        mismatches = await check_greedy(label, stub, pb, info, prompts, expected, model, args)
        await throughput(label, stub, pb, info, backend, sessions, args)
        if memory:
            await idle_memory(label, stub, pb, info, backend, args)
    return mismatches


def verifier_config(backend: str, path: Path, args, tp: int = 1):
    from edgespec.cloud.serving.config import VerifierConfig

    largest = max(counts(args) + [args.idle_sessions])
    common: dict[str, Any] = dict(model=str(path), device=args.device, backend=backend, max_sessions=largest + args.prompts,
                                  max_new_tokens=100_000, max_context=min(2048, _limit(path)))
    if args.device == "cpu":
        common["max_kv_bytes"] = 256 << 20  # a smoke run's KV space (vLLM's on the CPU, the pool's on transformers)
    if backend == "transformers":
        return VerifierConfig(**common, max_batch_size=largest, batch_wait_timeout_s=0.002)
    engine = {} if args.device == "cpu" else {"gpu_memory_utilization": args.vllm_memory}
    return VerifierConfig(**common, tensor_parallel_size=tp, engine_args=engine)


def serve_and_check(label: str, backend: str, path: Path, refs, args, ports: tuple[int, int], *, tp: int = 1,
                    sessions: list[int] | None = None, memory: bool = True) -> int:
    """One replica of ``backend`` serving ``path``: started, checked, deleted. A failure counts as a mismatch.
    ``ports``: Serve's gRPC and HTTP ports, the same for every replica of the run (one Serve)."""
    from ray import serve

    from edgespec.cloud.serving.app import APP_NAME, serve_verifier
    from edgespec.cloud.serving.config import DeploymentOptions

    gpu = args.device == "cuda"
    options = DeploymentOptions(num_gpus=1 if gpu else 0, num_cpus=1 if gpu else 0.5, graceful_shutdown_timeout_s=1.0)
    started = time.perf_counter()
    try:
        address = serve_verifier(verifier_config(backend, path, args, tp), options, grpc_port=ports[0], http_port=ports[1],
                                 timeout_s=600)
        where = f"{tp} GPU(s)" if gpu else args.device
        print(f"{label}: serving {path} at {address} ({where}, dtype auto) after "
              f"{time.perf_counter() - started:.0f}s", flush=True)
        mismatches = asyncio.run(check_target(label, backend, path, address, refs, args, sessions=sessions or counts(args),
                                              memory=memory))
        print(f"{label}: done in {time.perf_counter() - started:.0f}s", flush=True)
        return mismatches
    except Exception as exc:  # the other backends and targets still run; the exit code says it failed
        print(f"{label}: FAILED: {type(exc).__name__}: {exc}", flush=True)
        return 1
    finally:
        try:
            serve.delete(APP_NAME)
        except Exception as exc:  # Serve never started: nothing to delete
            print(f"{label}: (serve.delete: {exc!r})")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    gpus = torch.cuda.device_count() if args.device == "cuda" else 0
    vllm_error = vllm_import_error() if "vllm" in args.backends else None
    if args.plan:
        print("\n".join(plan(args, gpus, vllm_error)))
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print(NO_CUDA, file=sys.stderr)
        return 1
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from edgespec.cloud.serving.app import init_ray, stop_serving

    started = time.perf_counter()
    if args.device == "cuda":
        print(f"GPU: {torch.cuda.get_device_name(0)} x {gpus}, torch {torch.__version__}", flush=True)
    print("\n".join(plan(args, gpus, vllm_error)), flush=True)
    backends = [b for b in args.backends if b != "vllm" or vllm_error is None]
    if "vllm" in backends:  # (a failed import is in the plan's lines)
        import vllm

        print(f"vllm {vllm.__version__}", flush=True)
    if not backends:
        print("gpu_check: INCOMPLETE: no requested backend can run")
        return SKIPPED
    targets = [("demo", args.demo_target)]
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    if not args.skip_random:
        targets.append(("llama-1b", random_llama(work / "llama-1b", args.demo_target, args.layers, args.hidden, args.device)))
    init_ray(num_cpus=min(8, os.cpu_count() or 1) if args.device == "cuda" else 2, log_to_driver=False)
    from edgespec.cloud.bench.harness import free_port

    ports = (free_port(), free_port())
    failures = 0
    try:
        for name, path in targets:
            rng = random.Random(1)
            vocab = int(json.loads((path / "config.json").read_text())["vocab_size"])
            prompts = [[rng.randrange(1, vocab) for _ in range(rng.randrange(8, 200))] for _ in range(args.prompts)]
            model, expected = references(path, prompts, args.max_new_tokens, args.device)
            for backend in backends:
                failures += serve_and_check(f"{backend}/{name}", backend, path, (prompts, expected, model), args, ports)
            if name == targets[-1][0] and "vllm" in backends:
                failures += tensor_parallel(name, path, (prompts, expected, model), args, ports, gpus)
            del model
            if args.device == "cuda":
                torch.cuda.empty_cache()
    finally:
        stop_serving()  # (not serve.shutdown(): it waits 30 s on HAProxy's controller)
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    took = f"{time.perf_counter() - started:.0f}s"
    if failures:
        print(f"gpu_check: FAILED ({failures} mismatch(es) or failure(s)) in {took}")
        return 1
    if vllm_error is not None:
        print(f"gpu_check: INCOMPLETE: vllm was requested and did not run; the rest passed in {took}")
        return SKIPPED
    print(f"gpu_check: passed in {took}")
    return 0


def tensor_parallel(name: str, path: Path, refs, args, ports: tuple[int, int], gpus: int) -> int:
    """The vllm backend with the target split over --tensor-parallel-size GPUs, where there are as many."""
    tp = args.tensor_parallel_size
    if tp <= 1:
        return 0
    heads = int(json.loads((path / "config.json").read_text())["num_attention_heads"])
    if gpus < tp or heads % tp:
        why = f"{gpus} GPU(s) visible, it needs {tp}" if gpus < tp else f"{name} has {heads} attention heads, not a multiple of {tp}"
        print(f"vllm TP {tp}: skipped: {why}", flush=True)
        return 0
    return serve_and_check(f"vllm-tp{tp}/{name}", "vllm", path, refs, args, ports, tp=tp, sessions=[16], memory=False)


def _limit(path: Path) -> int:
    return int(json.loads((path / "config.json").read_text()).get("max_position_embeddings") or 2048)


if __name__ == "__main__":
    sys.exit(main())
