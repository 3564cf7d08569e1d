"""Prompt files cut from whole source files: each prompt ends at a function or class header.

A prompt is the header of a ``def`` / ``class`` (decorators and a multi-line signature
included) plus the lines before it, so the model's job is to write the body: the
code-completion case the demo is about.

NOTE: a prompt ends at the end of the header line WITHOUT its newline. Byte-level BPE cuts
"newline + indentation" into one pre-token, so in training a lone "\\n" token is only ever
followed by column-0 text; a prompt ending in "\\n" would ask the models for something they
never saw. Ending before the newline lets them produce the usual "\\n    " token themselves.
"""

from __future__ import annotations

import ast
import hashlib
import random
from dataclasses import asdict, dataclass

from tokenizers import Tokenizer


@dataclass(frozen=True)
class PromptSpec:
    count: int = 64
    min_tokens: int = 100
    max_tokens: int = 300
    max_per_file: int = 2  # spread prompts over many files
    seed: int = 0

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"count must be >= 1, got {self.count}")
        if not 0 < self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens/max_tokens must satisfy 0 < min <= max, got {self.min_tokens}/{self.max_tokens}")
        if self.max_per_file < 1:
            raise ValueError(f"max_per_file must be >= 1, got {self.max_per_file}")


@dataclass(frozen=True)
class Prompt:
    id: str
    source: str  # file path relative to the stdlib root
    line: int  # 1-based line of the header's last line
    prompt: str
    prompt_tokens: int

    def to_json(self) -> dict:
        return asdict(self)


def header_ends(source: str) -> list[int]:
    """1-based last line of every function/class header whose body starts on a later line."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []  # a few stdlib test files are deliberately invalid
    ends = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            body_line = node.body[0].lineno
            if body_line > node.lineno:
                ends.append(body_line - 1)
    return sorted(set(ends))


def _cut(lines: list[str], end: int, tokenizer: Tokenizer, want: int, spec: PromptSpec) -> tuple[str, int] | None:
    """Lines ending at ``end`` (1-based), extended upward until about ``want`` tokens."""
    chosen: list[str] = []
    best: tuple[str, int] | None = None
    for start in range(end - 1, -1, -1):
        chosen.insert(0, lines[start])
        text = "\n".join(chosen)
        n = len(tokenizer.encode(text).ids)
        if n > spec.max_tokens:
            break
        if n >= spec.min_tokens:
            best = (text, n)
            if n >= want:
                break
    return best


def cut_prompts(files: dict[str, str], tokenizer: Tokenizer, spec: PromptSpec, id_prefix: str) -> list[Prompt]:
    """``spec.count`` prompts from ``files`` (relpath -> text), chosen deterministically."""
    rng = random.Random(spec.seed)
    # Order files by a hash so the choice does not follow the directory layout.
    order = sorted(files, key=lambda p: hashlib.sha256(f"{spec.seed}:{p}".encode()).hexdigest())
    prompts: list[Prompt] = []
    for rounds in range(spec.max_per_file):
        for relpath in order:
            if len(prompts) == spec.count:
                return prompts
            lines = files[relpath].splitlines()
            ends = header_ends(files[relpath])
            used = {p.line for p in prompts if p.source == relpath}
            candidates = [e for e in ends if e not in used and e >= 3]
            if rounds >= 1 and not used:
                continue  # second pass only adds to files that gave a prompt already
            rng.shuffle(candidates)
            for end in candidates[:8]:
                cut = _cut(lines, end, tokenizer, rng.randint(spec.min_tokens, spec.max_tokens), spec)
                if cut is not None:
                    text, n = cut
                    prompts.append(Prompt(f"{id_prefix}-{len(prompts):03d}", relpath, end, text, n))
                    break
    if len(prompts) < spec.count:
        raise ValueError(f"only {len(prompts)} prompts could be cut from {len(files)} files; lower count or raise max_per_file")
    return prompts
