#!/bin/sh
# Rehearse `ray up cluster/ray-cluster.yaml` on this machine (see scripts/rehearse_ray_up.py):
#   scripts/rehearse_ray_up.sh          full: fresh venv, torch + the wheel, Ray, Serve, a session over TLS
#   scripts/rehearse_ray_up.sh --dry    fast: every command runs, pip --dry-run, Ray not started
set -e
cd "$(dirname "$0")/.."
exec .venv/bin/python scripts/rehearse_ray_up.py "$@"
