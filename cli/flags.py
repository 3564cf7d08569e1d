"""Flags several commands share, so each is spelled and explained one way (docs/cli.md lists the
vocabulary), and the old spellings still accepted, with a warning.

Not a subcommand: ``edgespec.cli.COMMANDS`` names those.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Callable

from edgespec.edge import params


def add_connection(parser: argparse.ArgumentParser, *, server_help: str, required: bool = True) -> None:
    """--server and how to reach it: --api-key, --tls, --ca-cert (every command that talks to a server)."""
    parser.add_argument("--server", required=required, default=None, metavar="HOST:PORT", help=server_help)
    parser.add_argument("--api-key", default=os.environ.get("EDGESPEC_API_KEY"),
                        help="the verifier's API key (default: $EDGESPEC_API_KEY)")
    parser.add_argument("--tls", action="store_true", help="connect with TLS (the system's roots, or --ca-cert)")
    parser.add_argument("--ca-cert", type=Path, default=None, help="PEM file of the CA that signed the server's certificate (implies --tls)")


def add_deprecated(parser: argparse.ArgumentParser, old: str, new: str, dest: str, *,
                   convert: Callable[[str], Any] = str, note: str = "") -> None:
    """``old`` keeps working as a hidden alias of ``new`` and says so on stderr once used."""

    class Alias(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            print(f"edgespec: {old} is deprecated: use {new}{note}", file=sys.stderr)
            setattr(namespace, self.dest, convert(str(values)))

    parser.add_argument(old, dest=dest, action=Alias, help=argparse.SUPPRESS)


def parse_k(text: str) -> int | str:
    """--k: drafts per round, a positive number or 'auto' (the SDK's adaptive policy), as the
    SDK reads it (``params.parse_k``)."""
    try:
        return params.parse_k(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_fixed_k(text: str) -> int:
    """--k where the measurement needs a fixed number of drafts (raw rounds, no planner)."""
    if text == "auto":
        raise argparse.ArgumentTypeError("this mode sends raw rounds of a fixed size: give a number, not 'auto'")
    value = parse_k(text)
    assert isinstance(value, int)
    return value


def parse_counts(text: str) -> list[int]:
    """A comma list of positive integers (--sessions 1,4,16)."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated numbers, got {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"must be numbers >= 1, got {text!r}")
    return counts
