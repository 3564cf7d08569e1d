"""A device's first request, speculative (k=auto, the planner deciding) vs cloud-only, each on a
fresh client: nothing learnt from earlier requests. With a draft that never agrees with the
target, this is what the planner's fast give-up is for (goal: >= 0.95x cloud-only).

    .venv/bin/python lab/first_request.py --truncate 3 [--prompts 8] [--max-new-tokens 128]
    .venv/bin/python lab/first_request.py --draft DIR   # any exported ONNX draft instead

``--truncate N`` makes the hopeless draft first: the target's first N decoder layers, its own
embedding and head, no training (the real pair's draft before distillation, 3 such layers on
a smaller vocabulary, agreed with the target's greedy choice 0.029 of the time: see
models/smollm2-135m/README.md), exported to ONNX under runs/first-request/ (kept: a second run
reuses it).

Serves the real target (models/smollm2-135m/target) on CPU, one thread each side, HAProxy
ingress; the two arms alternate prompt by prompt on held-out chat prompts; prints per prompt
and overall ms/token and the ratio (cloud-only ms/token over speculative), and the share of
tokens the speculative arm produced while speculating.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def truncated_draft(target: Path, layers: int) -> Path:
    """The target cut to its first ``layers`` decoder layers, exported to ONNX (once)."""
    out = Path("runs/first-request") / f"{target.name}-{layers}-layers"
    if (out / "onnx" / "manifest.json").is_file():
        return out / "onnx"
    from transformers import AutoModelForCausalLM

    from edgespec.cloud.training.export import copy_tokenizer_files, export_draft

    model = AutoModelForCausalLM.from_pretrained(str(target), dtype="float32")
    if not 0 < layers < model.config.num_hidden_layers:
        raise SystemExit(f"--truncate must be in 1..{model.config.num_hidden_layers - 1}, got {layers}")
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:layers]
    model.save_pretrained(out / "hf")
    copy_tokenizer_files(target, out / "hf")
    return export_draft(out / "hf", out / "onnx", target_dir=target, overwrite=True).out_dir


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    drafts = parser.add_mutually_exclusive_group(required=True)
    drafts.add_argument("--draft", type=Path, help="an exported ONNX draft directory")
    drafts.add_argument("--truncate", type=int, metavar="N", help="draft: the target's first N layers, untrained")
    parser.add_argument("--target", type=Path, default=None, help="default: the real pair's target")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--grpc-port", type=int, default=9000)
    args = parser.parse_args()

    from edgespec.cloud.bench.harness import switch_log
    from edgespec.cloud.bench.links import decision_text
    from edgespec.cloud.demo.run import DemoConfig, load_chat_prompts, real_target
    from edgespec.cloud.serving.app import init_ray, serve_verifier, stop_serving
    from edgespec.cloud.serving.config import DeploymentOptions, VerifierConfig
    from edgespec.edge.client import EdgeClient

    target = args.target or real_target()
    draft = args.draft or truncated_draft(target, args.truncate)
    prompts = load_chat_prompts(DemoConfig(timing_prompts=args.prompts), target)
    init_ray(num_cpus=2, log_to_driver=False)
    serve_verifier(VerifierConfig(model=str(target), device="cpu", torch_threads=1, max_new_tokens=4096),
                   DeploymentOptions(num_cpus=1), grpc_port=args.grpc_port, timeout_s=600)
    address = f"127.0.0.1:{args.grpc_port}"
    totals = {"speculative": [0.0, 0], "cloud_only": [0.0, 0]}
    speculated = 0
    try:
        with EdgeClient(address, draft, draft_threads=1) as warm:
            warm.generate_cloud(prompts[0], max_new_tokens=4)  # the replica's first-call costs stay out
        for i, prompt in enumerate(prompts):
            arms = ("speculative", "cloud_only") if i % 2 == 0 else ("cloud_only", "speculative")
            line, results = [], {}
            for arm in arms:
                with EdgeClient(address, draft, draft_threads=1) as client:  # fresh: its planner knows nothing
                    started = time.perf_counter()
                    result = (client.generate(prompt, max_new_tokens=args.max_new_tokens) if arm == "speculative"
                              else client.generate_cloud(prompt, max_new_tokens=args.max_new_tokens))
                    seconds = time.perf_counter() - started
                results[arm] = result
                totals[arm][0] += seconds
                totals[arm][1] += len(result.token_ids)
                if arm == "speculative":
                    speculated += sum(n for path, n in result.segments if path == "speculative")
                line.append(f"{arm} {1000 * seconds / max(len(result.token_ids), 1):.1f} ms/token")
            print(f"prompt {i + 1}/{len(prompts)}: " + ", ".join(line), flush=True)
            for decision in switch_log(results["speculative"]):
                print("    k=auto " + decision_text(decision), flush=True)
    finally:
        stop_serving()
    spec = 1000 * totals["speculative"][0] / totals["speculative"][1]
    cloud = 1000 * totals["cloud_only"][0] / totals["cloud_only"][1]
    print(f"first requests on fresh clients: speculative {spec:.1f} vs cloud-only {cloud:.1f} ms/token: "
          f"{cloud / spec:.3f}x; {speculated} of {totals['speculative'][1]} tokens speculative")
    return 0


if __name__ == "__main__":
    sys.exit(main())
