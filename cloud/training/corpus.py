"""The Python standard library's own source, split by file: the demo pair's corpus and the code tasks of
``edgespec make-draft``'s instructions.

Splitting by file (not by window) keeps the held-out prompts honest: no line of a held-out
file is ever seen in training, distillation or tuning. The split of a file depends only on a
hash of its path relative to the stdlib root, so it is the same on every machine and does not
move when other files are added or removed (a new Python version only adds or drops files).
"""

from __future__ import annotations

import hashlib
import re
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

SPLITS = ("train", "validation", "heldout")

# Generated or platform-specific files: not the code-completion workload we want to model,
# or (for _sysconfigdata / config-*) different on every machine, which would break the split.
EXCLUDED_PARTS = ("site-packages", "lib-dynload", "__pycache__")
EXCLUDED_PREFIXES = ("config-", "_sysconfigdata_")
EXCLUDED_FILES = ("pydoc_data/topics.py",)  # ~750 kB of rendered documentation in one string

# Lines of a lookup table (codec charmaps, unicode tables): a file made mostly of these is
# data, and would teach the models to emit hex escapes.
_TABLE_LINE = re.compile(r"^\s*(0x[0-9A-Fa-f]+\s*[:,]|u?'\\[xuU][0-9A-Fa-f]+')")


@dataclass(frozen=True)
class SplitFractions:
    """Percent of files (by path hash) in validation and held-out; the rest is train."""

    validation_percent: int = 5
    heldout_percent: int = 5

    def __post_init__(self) -> None:
        for name in ("validation_percent", "heldout_percent"):
            value = getattr(self, name)
            if not 0 < value < 50:
                raise ValueError(f"{name} must be in (0, 50), got {value}")


@dataclass(frozen=True)
class CorpusFile:
    relpath: str  # POSIX path relative to the stdlib root
    split: str
    sha256: str
    n_bytes: int


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def python_version() -> str:
    return ".".join(str(v) for v in sys.version_info[:3])


def split_of(relpath: str, fractions: SplitFractions = SplitFractions()) -> str:
    """The split a file belongs to, from a hash of its relative path alone."""
    bucket = int.from_bytes(hashlib.sha256(relpath.encode("utf-8")).digest()[:8], "big") % 100
    if bucket < fractions.heldout_percent:
        return "heldout"
    if bucket < fractions.heldout_percent + fractions.validation_percent:
        return "validation"
    return "train"


def _excluded_by_path(relpath: str) -> bool:
    parts = relpath.split("/")
    if any(part in EXCLUDED_PARTS for part in parts):
        return True
    if any(part.startswith(EXCLUDED_PREFIXES) for part in parts):
        return True
    return relpath in EXCLUDED_FILES


def is_data_like(text: str, max_table_share: float = 0.3) -> bool:
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return True
    table = sum(1 for line in lines if _TABLE_LINE.match(line))
    return table / len(lines) > max_table_share


def read_source(path: Path) -> str | None:
    """The file's text, or None if it is not UTF-8 (a few stdlib tests are deliberately not)."""
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return None


def list_corpus(
    root: Path | None = None, *, fractions: SplitFractions = SplitFractions(), max_file_bytes: int = 400_000
) -> list[CorpusFile]:
    """Every usable ``.py`` file under ``root``, sorted by path, with its split and content hash."""
    root = stdlib_root() if root is None else Path(root)
    files: list[CorpusFile] = []
    for path in sorted(root.rglob("*.py")):
        relpath = path.relative_to(root).as_posix()
        if _excluded_by_path(relpath) or not path.is_file():
            continue
        raw = path.read_bytes()
        if len(raw) > max_file_bytes or not raw.strip():
            continue
        text = read_source(path)
        if text is None or is_data_like(text):
            continue
        files.append(CorpusFile(relpath, split_of(relpath, fractions), hashlib.sha256(raw).hexdigest(), len(raw)))
    return files


def split_digest(files: list[CorpusFile]) -> str:
    """One hash over (path, split, content hash) of every file: equal digests, equal corpora."""
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.relpath}\t{f.split}\t{f.sha256}\n".encode("utf-8"))
    return h.hexdigest()
