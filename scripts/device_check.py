"""The device check: the verifier's engine alone on one GPU, without Serve (edgespec.cloud.bench.device_check).

    python scripts/device_check.py                 # on a GPU machine, from the repository root
    python scripts/device_check.py --device cpu --layers 2 --hidden 64 --prompts 2 --max-new-tokens 8 \\
        --rows 1,4 --context 32 --steps 2          # the same checks, small, on any machine

Needs torch and transformers only: no Ray, no gRPC, no install of edgespec (this checkout's own
code is imported). Greedy through the engine == generate() in bf16 for the demo target and a
~1B random Llama, the packed step's time at 1, 16 and 64 rows, KV bytes per token and session;
exit code 1 on a mismatch. About a minute on one H100 (budget: 5).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def import_this_checkout() -> str:
    """Makes ``edgespec`` this checkout: ``src/`` (links into the top-level folders) on the path,
    or, where a copy of the tree lost its links, the same namespace package spelled out."""
    if (REPO / "src" / "edgespec" / "cloud" / "serving").is_dir():
        sys.path.insert(0, str(REPO / "src"))
        return f"edgespec from {REPO / 'src'} (its links)"
    spec = importlib.util.spec_from_loader("edgespec", loader=None, is_package=True)
    assert spec is not None and spec.submodule_search_locations is not None
    # edgespec.edge, .cloud and .cli are the folders of those names; edgespec.v1 is proto/edgespec/v1
    spec.submodule_search_locations[:] = [str(REPO), str(REPO / "proto" / "edgespec")]
    sys.modules["edgespec"] = importlib.util.module_from_spec(spec)
    return f"edgespec from {REPO} (src/ has lost its links: the folders themselves)"


if __name__ == "__main__":
    print(import_this_checkout(), flush=True)
    from edgespec.cloud.bench.device_check import main

    sys.exit(main())
