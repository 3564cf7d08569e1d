"""Settings files: the one loader behind every ``--config`` (YAML or JSON) and ``from_dict``.

Every component has one config dataclass, validated on construction; this module turns a
mapping (from a file, a Serve YAML's ``args`` or Python) into that dataclass, refusing unknown
fields by name and prefixing every error with where the values came from.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")


def load_settings(path: str | Path) -> dict[str, Any]:
    """A mapping of settings from a ``.yaml``/``.yml`` or JSON file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{path}: cannot read settings: {exc.strerror or exc}") from None
    if path.suffix in (".yaml", ".yml"):
        import yaml  # only the cloud extra installs PyYAML; JSON needs nothing

        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: not valid YAML: {exc}") from None
    else:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    return data


def settings_text(path: str | Path, data: Mapping[str, Any]) -> str:
    """``data`` written the way ``load_settings`` reads ``path``: YAML for ``.yaml``/``.yml``, else JSON."""
    if Path(path).suffix in (".yaml", ".yml"):
        import yaml

        return yaml.safe_dump(dict(data), sort_keys=False)
    return json.dumps(data, indent=2) + "\n"


def build_config(cls: type[T], values: Mapping[str, Any], source: str = "") -> T:
    """``cls(**values)`` with unknown fields refused by name; errors say where the values came from."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    prefix = f"{source}: " if source else ""
    if unknown:
        raise ValueError(f"{prefix}unknown setting(s) {unknown} for {cls.__name__}; known: {sorted(known)}")
    try:
        return cls(**values)
    except TypeError as exc:  # a required field missing
        raise ValueError(f"{prefix}{exc}") from None
    except ValueError as exc:
        raise ValueError(f"{prefix}{exc}") from None
