"""The ``edgespec`` command: a thin dispatcher to the subcommands.

Each subcommand is one module of this package (``edgespec.cli.serve`` for ``edgespec serve``)
with two functions, ``add_arguments(parser)`` and ``run(args) -> int``. Argument parsing lives
here and only here; the modules call the library with a validated config. A subcommand's
module is imported only when it runs, so an edge-only install (no torch, no Ray) can run
``edgespec generate``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help, extra needed)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("run the verifier on Ray Serve (gRPC ingress)", "cloud"),
    "keys": ("manage the verifier's API keys file", "cloud"),
    "generate": ("generate text: ONNX draft on this device, target in the cloud", "edge"),
    "device-server": ("an OpenAI-compatible HTTP server on the device, speculating with the cloud", "edge"),
    "import-gguf": ("import a GGUF model (file or installed package) into a Hugging Face directory", "gguf"),
    "export-draft": ("export a Hugging Face causal LM to an ONNX draft", "cloud"),
    "distill": ("align a draft to a target by distillation", "cloud"),
    "evaluate": ("offline figures of a draft/target pair: losses, alpha, simulated acceptance", "cloud"),
    "train-demo": ("train the demo tokenizer, target and draft", "cloud"),
    "make-draft": ("make a draft for any chat target: its replies, a reduced vocabulary, distillation (GPU if there is one)", "cloud"),
    "demo": ("start Serve with the demo target and generate with the demo draft", "cloud"),
    "bench": ("measure and tune a draft/target pair: `edgespec bench MODE`, e.g. report, capacity, links, load", "cloud"),
    "link": ("emulate a network link (delay, jitter, bandwidth, faults) as a TCP proxy", "cloud"),
    "simulate": ("simulate a fleet of devices and replicas (discrete events)", "cloud"),
}


# Packages that only some extras install: a missing one means the wrong extra, not a bug.
OPTIONAL_DEPENDENCIES = {"torch", "transformers", "ray", "onnx", "onnxscript", "onnxruntime", "numpy", "tokenizers", "safetensors", "grpc_health", "yaml", "tqdm", "matplotlib", "gguf", "accelerate"}


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgespec",
        description="Speculative decoding across the edge and the cloud.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_text, _) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        args = _build_parser().parse_args(argv)
        if args.version:
            from edgespec.edge import __version__

            print(__version__)
            return 0
        _build_parser().print_help()
        return 0 if not argv else 2
    name = argv[0]
    help_text, extra = COMMANDS[name]
    try:
        module = importlib.import_module(f"edgespec.cli.{name.replace('-', '_')}")
    except ImportError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing in OPTIONAL_DEPENDENCIES:
            print(
                f"edgespec {name}: needs '{missing}', which comes with the '{extra}' extra: "
                f"pip install 'edgespec[{extra}]'",
                file=sys.stderr,
            )
            return 2
        raise
    parser = argparse.ArgumentParser(prog=f"edgespec {name}", description=help_text)
    module.add_arguments(parser)
    rest = argv[1:]
    if hasattr(module, "with_default_mode"):  # a command with modes, and one run when none is named
        rest = module.with_default_mode(rest)
    args = parser.parse_args(rest)
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
