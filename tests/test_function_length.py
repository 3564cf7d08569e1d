"""Small pieces: no function of the device SDK or the verifier's serving code is longer than 60
lines (signature and docstring included), so each reads at a glance."""

from __future__ import annotations

import ast

from helpers import REPO

MAX_LINES = 60
FOLDERS = ["edge", "cloud/serving"]


def test_no_function_is_longer_than_60_lines():
    long = []
    for folder in FOLDERS:
        for path in sorted((REPO / folder).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_LINES:
                        long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {lines} lines")
    assert not long, long
