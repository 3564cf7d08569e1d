"""The GPU check behind ``scripts/gpu_check.sh``: serve real targets on one CUDA device in bf16
through the real Serve gRPC path, check greedy == ``generate()``, print throughput and step times.

1. targets: the demo target (``models/demo/target``) and a ~1B-parameter random Llama built on
   the GPU (``random_llama``: default init, a wide output layer so that greedy argmax ties are
   rare; saved in bf16 with the demo tokenizer);
2. per target, one replica (``device: cuda``, dtype auto = bf16, num_gpus 1):
   - greedy check: --prompts sessions at once, drafts half right (two of the reference's tokens,
     two wrong ones: accept, reject and rollback every round), against ``generate()`` of the
     same weights in bf16 on the same GPU. A divergence where ``generate()``'s own top-two
     logits are within bf16 resolution (``near_tie``) is printed as a tie, not a mismatch:
     two correct bf16 kernels may round such a pair either way. Any other divergence fails;
   - throughput: 1, 16 and 64 sessions of raw greedy rounds (k random drafts): verified
     tokens/s, and the replica's step time (forward + accept) by batch size;
   - memory: KV bytes per token and per session (whole pages of the pool).

Exit code 1 on any mismatch. Needs nothing beyond ``make setup`` (torch with CUDA on the GPU host).
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

REPO = Path(__file__).resolve().parents[2]
NO_CUDA = "gpu_check: no CUDA device (torch.cuda.is_available() is False): run it on a machine with an NVIDIA GPU"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpu_check.sh", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--demo-target", type=Path, default=REPO / "models" / "demo" / "target")
    parser.add_argument("--layers", type=int, default=20, help="random Llama: layers (20 x 2048 wide: ~1.0B parameters)")
    parser.add_argument("--hidden", type=int, default=2048, help="random Llama: width")
    parser.add_argument("--sessions", default="1,16,64", help="throughput: concurrent sessions")
    parser.add_argument("--rounds", type=int, default=40, help="throughput: rounds per session")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=8, help="greedy check: sessions verified together")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="greedy check: tokens per session")
    parser.add_argument("--skip-random", action="store_true", help="only the demo target")
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: a smoke run of this script's own logic
    parser.add_argument("--work", type=Path, default=None, help="where the random model is written (default a temp dir)")
    return parser.parse_args(argv)


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


async def greedy_session(stub, pb, fingerprint: str, vocab: int, prompt: list[int], reference: list[int]) -> list[int]:
    """Drafts two of the reference's next tokens and two wrong ones per round; returns the committed tokens."""
    call = stub.Session()
    await call.write(pb.SessionRequest(open=pb.Open(prompt_ids=prompt, mode=pb.VERIFY_MODE_GREEDY, tokenizer_fingerprint=fingerprint,
                                                    max_new_tokens=len(reference))))
    opened = await call.read()
    if not opened.HasField("opened"):
        raise RuntimeError(f"open refused: {opened}")
    committed: list[int] = []
    for round_no in range(len(reference) + 1):
        done = len(committed)
        right = reference[done : done + 2]
        drafts = right + [(t + 1) % vocab for t in reference[done + 2 : done + 4]] or [1]
        await call.write(pb.SessionRequest(draft=pb.Draft(round=round_no, token_ids=drafts)))
        verdict = (await call.read()).verdict
        committed += list(drafts[: verdict.accepted]) + [verdict.next_token]
        if verdict.finished:
            break
    await call.write(pb.SessionRequest(close=pb.Close()))
    await call.done_writing()
    return committed


async def raw_session(stub, pb, fingerprint: str, vocab: int, k: int, rounds: int, seed: int, out: dict) -> None:
    rng = random.Random(seed)
    call = stub.Session()
    prompt = [rng.randrange(1, vocab) for _ in range(32)]
    await call.write(pb.SessionRequest(open=pb.Open(prompt_ids=prompt, mode=pb.VERIFY_MODE_GREEDY, tokenizer_fingerprint=fingerprint,
                                                    max_new_tokens=rounds * (k + 1))))
    await call.read()
    for round_no in range(rounds):
        await call.write(pb.SessionRequest(draft=pb.Draft(round=round_no, token_ids=[rng.randrange(1, vocab) for _ in range(k)])))
        verdict = (await call.read()).verdict
        out["verified"] += k + 1
        out["steps"][verdict.batch_size].append(verdict.verify_ms)
        if verdict.finished:
            break
    await call.write(pb.SessionRequest(close=pb.Close()))
    await call.done_writing()


async def check_target(name: str, path: Path, address: str, args) -> int:
    """Greedy check, throughput and memory of one served target; returns the number of mismatches."""
    import grpc  # here, not at the top: the device check imports this module's models on machines without gRPC

    from edgespec.v1 import speculative_pb2 as pb
    from edgespec.v1 import speculative_pb2_grpc as pb_grpc

    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.SpeculativeStub(channel)
        info = await stub.Info(pb.InfoRequest(), timeout=60)
        if info.model_id != path.name:
            raise RuntimeError(f"{address} serves {info.model_id!r}, not {path.name!r}")
        rng = random.Random(1)
        prompts = [[rng.randrange(1, info.vocab_size) for _ in range(rng.randrange(8, 200))] for _ in range(args.prompts)]
        model, refs = references(path, prompts, args.max_new_tokens, args.device)
        served = await asyncio.gather(*(greedy_session(stub, pb, info.tokenizer_fingerprint, info.vocab_size, p, r)
                                        for p, r in zip(prompts, refs)))
        mismatches = ties = 0
        import torch

        for prompt, ref, got in zip(prompts, refs, served):
            first = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), None)
            if first is None and len(got) == len(ref):
                continue
            if first is None:
                mismatches += 1
                print(f"  MISMATCH {name}: {len(got)} tokens served, {len(ref)} expected")
                continue
            with torch.inference_mode():
                logits = model(input_ids=torch.tensor([prompt + ref[:first]], device=args.device)).logits[0, -1].float()
            if near_tie(logits, ref[first], got[first]):
                ties += 1
                print(f"  tie {name}: token {first}: generate() {ref[first]}, served {got[first]}, logits "
                      f"{float(logits[ref[first]]):.4f} vs {float(logits[got[first]]):.4f} (bf16 resolution)")
            else:
                mismatches += 1
                print(f"  MISMATCH {name}: token {first}: generate() {ref[first]}, served {got[first]}")
        del model
        if args.device == "cuda":
            torch.cuda.empty_cache()
        verdict = "OK" if not mismatches else "FAILED"
        print(f"{name}: greedy == generate() {verdict}: {args.prompts} sessions x {args.max_new_tokens} tokens, "
              f"{mismatches} mismatch(es), {ties} bf16 tie(s)", flush=True)
        steps: dict[int, list[float]] = defaultdict(list)
        for count in (int(n) for n in args.sessions.split(",")):
            out = {"verified": 0, "steps": steps}
            started = time.perf_counter()
            await asyncio.gather(*(raw_session(stub, pb, info.tokenizer_fingerprint, info.vocab_size, args.k, args.rounds, s, out)
                                   for s in range(count)))
            wall = time.perf_counter() - started
            print(f"{name}: {count:3d} sessions  verified {out['verified'] / wall:9.0f} tokens/s  (k={args.k}, "
                  f"{args.rounds} rounds each, {wall:.1f}s)", flush=True)
        print(f"{name}: step time (forward + accept) by batch size:")
        for size in sorted(steps):
            values = steps[size]
            print(f"  batch {size:3d}: median {statistics.median(values):7.2f} ms over {len(values)} rows")
        per_token = info.kv_bytes_per_token
        for context in (256, 2048):
            pages = -(-context // 16)
            print(f"{name}: GPU memory per session at {context} tokens: {pages * 16 * per_token / 2**20:.1f} MiB "
                  f"(KV {per_token} B/token, whole 16-token pages)")
    return mismatches


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(NO_CUDA, file=sys.stderr)
        return 1
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from edgespec.cloud.bench.harness import free_port
    from edgespec.cloud.serving.app import APP_NAME, init_ray, serve_verifier, stop_serving
    from edgespec.cloud.serving.config import DeploymentOptions, VerifierConfig

    started = time.perf_counter()
    if args.device == "cuda":
        print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}", flush=True)
    targets = [("demo", args.demo_target)]
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    if not args.skip_random:
        targets.append(("llama-1b", random_llama(work / "llama-1b", args.demo_target, args.layers, args.hidden, args.device)))
    init_ray(num_cpus=min(8, os.cpu_count() or 1) if args.device == "cuda" else 2, log_to_driver=False)
    from ray import serve  # after init_ray: the ingress is chosen before Ray is imported
    largest = max(int(n) for n in args.sessions.split(","))
    http_port = free_port()
    failures = 0
    port = free_port()  # one Serve, one gRPC port: each target replaces the last as the same app
    try:
        for name, path in targets:
            config = VerifierConfig(model=str(path), device=args.device, max_sessions=largest + args.prompts, max_batch_size=largest,
                                    max_new_tokens=100_000, batch_wait_timeout_s=0.002, max_context=min(2048, _limit(path)))
            options = DeploymentOptions(num_gpus=1 if args.device == "cuda" else 0, num_cpus=1 if args.device == "cuda" else 0.5,
                                        graceful_shutdown_timeout_s=1.0)
            address = serve_verifier(config, options, grpc_port=port, http_port=http_port, timeout_s=300)
            print(f"{name}: serving {path} at {address} ({args.device}, dtype auto)", flush=True)
            failures += asyncio.run(check_target(name, path, address, args))
            serve.delete(APP_NAME)
    finally:
        stop_serving()  # (not serve.shutdown(): it waits 30 s on HAProxy's controller)
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"gpu_check: {'FAILED' if failures else 'passed'} in {time.perf_counter() - started:.0f}s")
    return 1 if failures else 0


def _limit(path: Path) -> int:
    import json

    return int(json.loads((path / "config.json").read_text()).get("max_position_embeddings") or 2048)


if __name__ == "__main__":
    sys.exit(main())
