#!/usr/bin/env bash
# The GPU check: serve the demo target and a ~1B random Llama on one CUDA device in bf16 through
# the real Serve gRPC path; greedy == generate() for both, verified tokens/s at 1, 16 and 64
# sessions, step time per batch size, GPU memory per session. Exits non-zero on any mismatch.
# Under 10 minutes on one GPU; installs nothing beyond `make setup`.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"

usage() {
  cat <<'USAGE'
usage: scripts/gpu_check.sh [--help] [options passed to edgespec.cloud.bench.gpu_check]

Serves models/demo/target and a ~1B-parameter random Llama (built on the fly) on one CUDA
device in bfloat16 through Ray Serve's gRPC ingress, and prints:
  - greedy == generate() for each target (sessions verified together; exit 1 on a mismatch)
  - verified tokens/s at 1, 16 and 64 concurrent sessions
  - the replica's step time (forward + accept) per batch size
  - GPU memory (KV) per session
Needs `make setup` first (the project's .venv) and a CUDA device; without one it exits 1.

options: --sessions 1,16,64  --rounds 40  --k 4  --prompts 8  --max-new-tokens 48
         --layers 20 --hidden 2048 (the random Llama)  --skip-random  --work DIR
USAGE
}

for arg in "$@"; do
  case "$arg" in
    -h|--help) usage; exit 0 ;;
  esac
done

if [ ! -x "$PY" ]; then
  echo "gpu_check: $PY not found: run 'make setup' first" >&2
  exit 2
fi
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "gpu_check: no CUDA device (torch.cuda.is_available() is False): run it on a machine with an NVIDIA GPU" >&2
  exit 1
fi
cd "$ROOT"
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}" RAY_USAGE_STATS_ENABLED=0
exec timeout 590 "$PY" -m edgespec.cloud.bench.gpu_check "$@"
