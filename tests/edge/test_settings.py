"""Settings files: YAML or JSON into a config dataclass, unknown fields refused by name."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from edgespec.edge.settings import build_config, load_settings


@dataclass(frozen=True)
class Example:
    name: str
    size: int = 1

    def __post_init__(self):
        if self.size < 1:
            raise ValueError(f"size must be >= 1, got {self.size}")


def test_yaml_and_json_load_the_same_mapping(tmp_path):
    (tmp_path / "a.yaml").write_text("name: x\nsize: 3\n")
    (tmp_path / "a.json").write_text('{"name": "x", "size": 3}')
    assert load_settings(tmp_path / "a.yaml") == load_settings(tmp_path / "a.json") == {"name": "x", "size": 3}
    (tmp_path / "empty.yaml").write_text("")
    assert load_settings(tmp_path / "empty.yaml") == {}


@pytest.mark.parametrize("name, text, message", [
    ("list.json", "[1, 2]", "expected a mapping"),
    ("broken.json", "{", "not valid JSON"),
    ("broken.yaml", "a: [", "not valid YAML"),
])
def test_bad_files_say_what_is_wrong(tmp_path, name, text, message):
    (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=message):
        load_settings(tmp_path / name)


def test_missing_file(tmp_path):
    with pytest.raises(ValueError, match="cannot read settings"):
        load_settings(tmp_path / "nope.yaml")


def test_build_config_names_unknown_and_bad_fields_and_the_source():
    assert build_config(Example, {"name": "x"}) == Example("x")
    with pytest.raises(ValueError, match=r"conf.yaml: unknown setting\(s\) \['colour'\] for Example"):
        build_config(Example, {"name": "x", "colour": "red"}, "conf.yaml")
    with pytest.raises(ValueError, match="conf.yaml: size must be >= 1"):
        build_config(Example, {"name": "x", "size": 0}, "conf.yaml")
    with pytest.raises(ValueError, match="name"):
        build_config(Example, {})
