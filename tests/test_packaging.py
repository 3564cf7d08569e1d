"""Every package in the source tree is in the distribution (the package-dir mapping rules out
automatic discovery), so a non-editable install has all the modules an editable one has."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping = config["package-dir"]
    on_disk = set()
    for prefix, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder)
            on_disk.add(".".join([prefix, *relative.parts]))
    assert on_disk <= set(config["packages"]), sorted(on_disk - set(config["packages"]))
