"""``edgespec export-draft``: a local Hugging Face causal LM -> an ONNX draft for the device."""

from __future__ import annotations

import argparse
import sys

from edgespec.cloud.training.export import DEFAULT_OPSET, EXPORTERS, ExportError, export_draft


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="local Hugging Face causal-LM directory (with tokenizer.json)")
    parser.add_argument("--out", required=True,
                        help="directory to create: model.onnx, manifest.json, tokenizer.json and the tokenizer's side files")
    parser.add_argument("--opset", type=int, default=DEFAULT_OPSET, help="ONNX opset (default %(default)s)")
    parser.add_argument("--parity-steps", type=int, default=20, help="cached greedy steps compared (default %(default)s)")
    parser.add_argument("--tolerance", type=float, default=1e-4,
                        help="max |logit diff| allowed, as a fraction of max(1, max |logit|) (default %(default)g)")
    parser.add_argument("--prob-tolerance", type=float, default=1e-3, help="max |softmax diff| allowed (default %(default)g)")
    parser.add_argument("--quantize", choices=["int8"], default=None,
                        help="ship dynamic int8 weights (onnxruntime.quantization) after the float graph passed parity")
    parser.add_argument("--keep-fp32", action="store_true", help="with --quantize: keep the float graph as model.fp32.onnx")
    parser.add_argument("--target", default=None,
                        help="the target directory the draft is for: recorded in the manifest (name, tokenizer fingerprint), "
                             "which must match; a vocab-mapped draft (draft_vocab.json) takes its tokenizer from it")
    parser.add_argument("--exporter", choices=EXPORTERS, default="dynamo", help="torch.onnx path (default %(default)s)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    parser.add_argument("--max-positions", type=int, default=None,
                        help="longest context the draft serves (default: the config's; ALiBi models name none: 2048)")


def run(args: argparse.Namespace) -> int:
    try:
        report = export_draft(
            args.model, args.out, opset=args.opset, parity_steps=args.parity_steps,
            tolerance=args.tolerance, prob_tolerance=args.prob_tolerance, exporter=args.exporter,
            overwrite=args.overwrite, max_positions=args.max_positions, quantize=args.quantize,
            keep_fp32=args.keep_fp32, target_dir=args.target,
        )
    except (ExportError, ValueError, FileNotFoundError) as exc:
        print(f"edgespec export-draft: {exc}", file=sys.stderr)
        return 1
    print(f"exported {report.onnx_path} in {report.seconds:.1f} s")
    return 0
