"""scripts/install.py: pip's configuration carried over to uv (make setup installs with uv)."""

import importlib.util
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "install_script", Path(__file__).resolve().parents[1] / "scripts" / "install.py"
)
assert _SPEC and _SPEC.loader
install = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(install)

# What `pip config list` printed on the project's build machine, plus a user file and a no-index.
LISTING = """\
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.find-links='/opt/wheels'
global.cert='/somewhere/else.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/global/wheels'
user.index-url='https://mirror.example/simple'
global.index-url='https://pypi.org/simple'
not a setting
"""


def test_each_key_takes_the_value_of_its_highest_scope():
    settings = install.pip_settings(LISTING)
    assert settings["find-links"] == "/opt/wheels"  # the environment over the global file
    assert settings["cert"] == "/etc/ssl/certs/ca-certificates.crt"
    assert settings["index-url"] == "https://mirror.example/simple"  # user over global, in any order
    assert settings["constraint"] == "/etc/xdg/pip/constraints.txt"


def test_settings_become_uv_flags_with_lists_split(monkeypatch):
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    flags, env = install.uv_arguments(install.pip_settings(LISTING))
    assert flags == [
        "--index-strategy", "unsafe-best-match",
        "--index-url", "https://mirror.example/simple",
        "--extra-index-url", "file:///opt/pypi/simple",
        "--extra-index-url", "file:///opt/pypi-more/simple",
        "--find-links", "/opt/wheels",
        "--constraint", "/etc/xdg/pip/constraints.txt",
    ]
    assert env == {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt"}


def test_no_index_and_an_empty_configuration(monkeypatch):
    monkeypatch.setenv("SSL_CERT_FILE", "/mine.crt")  # the caller's own choice is kept
    flags, env = install.uv_arguments(install.pip_settings(":env:.no-index='true'\nglobal.cert='/x'\n"))
    assert flags[2:] == ["--no-index"] and env == {}
    assert install.uv_arguments(install.pip_settings("")) == (["--index-strategy", "unsafe-best-match"], {})
