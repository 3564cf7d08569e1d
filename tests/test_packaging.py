"""Every package in the source tree is in the distribution (the package-dir mapping rules out
automatic discovery), so a non-editable install has all the modules an editable one has."""

from __future__ import annotations

import tomllib

from helpers import REPO


def test_every_package_is_listed_in_pyproject():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping = config["package-dir"]
    on_disk = set()
    for prefix, folder in mapping.items():
        for init in (REPO / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(REPO / folder)
            on_disk.add(".".join([prefix, *relative.parts]))
    assert on_disk <= set(config["packages"]), sorted(on_disk - set(config["packages"]))
