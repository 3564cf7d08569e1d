"""The import direction is one way: each layer imports only the layers below it.

    edgespec.v1             the contract (generated code)
    edgespec.edge           the device SDK: never torch, Ray or transformers
    edgespec.cloud.serving  the verifier: never the tooling
    edgespec.cloud.link     link profiles and the emulator
    edgespec.cloud.training export, distillation, training loop, data
    edgespec.cloud.simulate the fleet simulator
    edgespec.cloud.bench    measurements
    edgespec.cloud.demo     the demo pair and `make demo`
    edgespec.cli            the command line

Every import is checked, including those inside functions (a lazy import is still a dependency).
Apart from them, lab/ (experiments, run by hand) imports the package and no test code.
"""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import REPO

LAYERS = [
    "edgespec.v1",
    "edgespec.edge",
    "edgespec.cloud.serving",
    "edgespec.cloud.link",
    "edgespec.cloud.training",
    "edgespec.cloud.simulate",
    "edgespec.cloud.bench",
    "edgespec.cloud.demo",
    "edgespec.cli",
]
# Packages whose own __init__ holds no code that imports anything: importable from any layer
# (``edgespec`` itself is a namespace: it has no code at all).
NEUTRAL = {"edgespec", "edgespec.cloud"}
# The package as installed: src/edgespec/<name> links to the folder holding edgespec.<name>.
SOURCES = {f"edgespec.{link.name}": link.resolve() for link in (REPO / "src" / "edgespec").iterdir()}
EDGE_FORBIDDEN = {"torch", "ray", "transformers", "safetensors", "onnx", "onnxscript", "scipy", "matplotlib"}


def layer_of(module: str) -> int | None:
    for index in range(len(LAYERS) - 1, -1, -1):
        if module == LAYERS[index] or module.startswith(LAYERS[index] + "."):
            return index
    return None


def modules() -> dict[str, Path]:
    """Every source module of the package, by dotted name."""
    out = {}
    for prefix, folder in SOURCES.items():
        for path in folder.rglob("*.py"):
            relative = path.relative_to(folder).with_suffix("")
            parts = [p for p in relative.parts if p != "__init__"]
            name = ".".join([prefix, *parts])
            out.setdefault(name, path)
    return out


def imports_of(source: str, module: str) -> set[str]:
    """Absolute names imported anywhere in ``source`` (relative imports resolved against ``module``)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(module.split(".")[: -node.level] + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def violations_in(module: str, source: str) -> list[str]:
    own = layer_of(module)
    found = []
    for name in sorted(imports_of(source, module)):
        if own == LAYERS.index("edgespec.edge") and name.split(".")[0] in EDGE_FORBIDDEN:
            found.append(f"{module} imports {name}: the edge SDK runs without it")
        if not name.startswith("edgespec") or name in NEUTRAL:
            continue
        theirs = layer_of(name)
        if theirs is not None and own is not None and theirs > own:
            found.append(f"{module} ({LAYERS[own]}) imports {name} ({LAYERS[theirs]}), a higher layer")
    return found


def test_every_module_imports_only_lower_layers():
    found = []
    for module, path in sorted(modules().items()):
        if module in NEUTRAL:
            continue
        assert layer_of(module) is not None, f"{module} ({path}) belongs to no layer: add it to LAYERS"
        found += violations_in(module, path.read_text(encoding="utf-8"))
    assert not found, "\n".join(found)


def test_the_checker_sees_lazy_and_relative_violations():
    lazy = "def f():\n    from edgespec.cloud.training.export import export_draft\n"
    assert violations_in("edgespec.cloud.serving.engine", lazy)
    assert violations_in("edgespec.edge.draft", "import torch\n")
    assert violations_in("edgespec.cloud.serving.app", "from ..bench import harness\n")
    assert not violations_in("edgespec.cloud.bench.harness", "from edgespec.cloud.serving.app import init_ray\n")


def test_the_layers_cover_the_whole_package():
    names = modules()
    for layer in LAYERS:
        assert any(name == layer or name.startswith(layer + ".") for name in names), f"no module in {layer}"


TEST_CODE = {"tests", "helpers", "conftest"}  # tests/ and what pytest puts on the path from it


def test_the_lab_imports_no_test_code():
    found = []
    for path in sorted((REPO / "lab").glob("*.py")):
        source = path.read_text(encoding="utf-8")
        names = imports_of(source, f"lab.{path.stem}")
        found += [f"lab/{path.name} imports {name}" for name in sorted(names) if name.split(".")[0] in TEST_CODE]
        if '"tests"' in source or "'tests'" in source:
            found.append(f"lab/{path.name} names the tests folder (a path into test code)")
    assert not found, "\n".join(found)


def test_the_lab_readme_says_what_each_experiment_does():
    readme = (REPO / "lab" / "README.md").read_text(encoding="utf-8")
    missing = [path.name for path in sorted((REPO / "lab").glob("*.py")) if f"`{path.name}`" not in readme]
    assert not missing, f"lab/README.md does not describe {missing}"
