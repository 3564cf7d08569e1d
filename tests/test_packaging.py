"""The package's layout is written once: src/edgespec/ holds one link per subpackage into the
repository's top-level folders, and setuptools finds every package through it (no list to keep)."""

from __future__ import annotations

import os
import tomllib

from helpers import REPO

PACKAGE_ROOT = REPO / "src" / "edgespec"


def links() -> dict[str, os.PathLike]:
    """Subpackage name -> the folder its link points at."""
    return {entry.name: entry.resolve() for entry in sorted(PACKAGE_ROOT.iterdir())}


def test_src_edgespec_holds_only_links_to_existing_folders():
    for entry in PACKAGE_ROOT.iterdir():
        assert entry.is_symlink(), f"{entry} is not a link: put code in the folder the links point at"
        assert entry.resolve().is_dir(), f"{entry} points at {os.readlink(entry)}, which is not a folder"
        assert not os.path.isabs(os.readlink(entry)), f"{entry}: links must be relative (the checkout moves)"
    assert set(links()) == {"v1", "edge", "cloud", "cli"}


def test_setuptools_finds_every_package_on_disk():
    from setuptools import find_namespace_packages

    find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    found = set(find_namespace_packages(where=str(REPO / find["where"][0]), include=find["include"], exclude=find["exclude"]))
    on_disk = {"edgespec"}
    for name, folder in links().items():
        for init in folder.rglob("__init__.py"):
            on_disk.add(".".join(["edgespec", name, *init.parent.relative_to(folder).parts]))
    assert on_disk == found, (sorted(on_disk - found), sorted(found - on_disk))


def test_nothing_in_the_checkout_root_shadows_the_package():
    assert not (REPO / "edgespec").exists() and not (REPO / "proto" / "__init__.py").exists()
