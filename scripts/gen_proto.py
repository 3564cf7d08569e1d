"""Regenerate the Python code for proto/ (run: `make proto`).

Generated files sit beside their .proto under proto/edgespec/v1 and are committed;
tests/test_proto.py fails when they differ from what this script would write.
Pinned generator: grpcio-tools==1.85.1 (see pyproject's dev extra).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = ROOT / "proto"


def proto_files() -> list[Path]:
    return sorted(PROTO_ROOT.glob("edgespec/**/*.proto"))


def generate(out_dir: Path) -> None:
    from grpc_tools import protoc  # dev dependency only

    import grpc_tools

    include = Path(grpc_tools.__file__).parent / "_proto"
    for proto in proto_files():
        args = [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"-I{include}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            str(proto),
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {proto}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=PROTO_ROOT, help="output root (default: proto/)")
    args = parser.parse_args(argv)
    generate(args.out)
    print(f"generated code for {len(proto_files())} proto file(s) under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
