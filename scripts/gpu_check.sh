#!/usr/bin/env bash
# The GPU check: serve the demo target and a ~1B random Llama on CUDA in bf16 through the real
# Serve gRPC path, on both verifier backends (transformers, vllm); greedy: speculative == cloud-only
# token for token and == generate() up to bf16 ties; tokens/s at 1, 16 and 64 sessions,
# speculative and cloud-only; memory held per idle session; vllm split over 2 GPUs where there are.
# Exit 1 on any mismatch, 3 where a requested backend could not run. Sized for ~10 minutes on one GPU.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"

usage() {
  cat <<'USAGE'
usage: scripts/gpu_check.sh [--help] [--plan] [options passed to edgespec.cloud.bench.gpu_check]

Serves models/demo/target and a ~1B-parameter random Llama (built on the fly) on CUDA in
bfloat16 through Ray Serve's gRPC ingress, one replica at a time, on each backend of --backends
(default transformers,vllm), and prints per backend and target:
  - greedy: speculative == cloud-only (Generate on the same replica) token for token, and
    == generate() up to bf16 near ties (printed as ties); exit 1 on a mismatch
  - tokens/s at 1, 16 and 64 concurrent sessions: speculative rounds (verified and committed)
    and cloud-only Generate streams; step time by batch size (transformers) or round latency (vllm)
  - memory held per session open and idle: KV reserved (transformers, pinned until Close);
    vLLM's KV blocks in use (evictable prefix cache: ~0 pinned); device memory in use
  - vllm with --tensor-parallel-size 2 (greedy, tokens/s at 16 sessions) where 2 GPUs are visible
vllm is skipped with a printed line where `import vllm` fails; the run then exits 3, not 0.
Needs `make setup` first (the project's .venv; vllm==0.29.0 for the vllm backend) and a CUDA
device; without one it exits 1. --plan prints the steps and exits (no GPU needed).

options: --backends transformers,vllm  --sessions 1,16,64  --rounds 40  --generate-tokens 128
         --k 4  --prompts 8  --max-new-tokens 48  --idle-sessions 64  --idle-tokens 256
         --tensor-parallel-size 2  --vllm-memory 0.5 (vLLM's gpu_memory_utilization)
         --layers 20 --hidden 2048 (the random Llama)  --skip-random  --work DIR
environment: GPU_CHECK_TIMEOUT_S (default 900): the hard stop
USAGE
}

plan_only=0
for arg in "$@"; do
  case "$arg" in
    -h|--help) usage; exit 0 ;;
    --plan) plan_only=1 ;;
  esac
done

if [ ! -x "$PY" ]; then
  echo "gpu_check: $PY not found: run 'make setup' first" >&2
  exit 2
fi
if [ "$plan_only" = 0 ] && ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "gpu_check: no CUDA device (torch.cuda.is_available() is False): run it on a machine with an NVIDIA GPU" >&2
  exit 1
fi
cd "$ROOT"
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}" RAY_USAGE_STATS_ENABLED=0
exec timeout "${GPU_CHECK_TIMEOUT_S:-900}" "$PY" -m edgespec.cloud.bench.gpu_check "$@"
