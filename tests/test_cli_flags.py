"""One vocabulary across the command line (docs/cli.md): the same flag for the same thing in every
command, each bench mode with only its own flags, --api-key and --tls wherever a command talks
to a server, and the old spellings still accepted with a warning."""

from __future__ import annotations

import argparse
import importlib

import pytest

from edgespec.cli import COMMANDS, main

# Spellings replaced by the vocabulary: never a visible flag again (still accepted, hidden).
RETIRED = {"--k-max", "--new-tokens", "--torch-threads", "--batch-wait-ms", "--profiles", "--profile", "--link-mix",
           "--profile-mix", "--sweep-k"}


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command's parser and every mode's, by its command line ("bench capacity")."""
    found = {}
    for name in COMMANDS:
        parser = argparse.ArgumentParser(prog=f"edgespec {name}")
        importlib.import_module(f"edgespec.cli.{name.replace('-', '_')}").add_arguments(parser)
        found[name] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for mode, subparser in action.choices.items():
                    found[f"{name} {mode}"] = subparser
    return found


def visible_flags(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for action in parser._actions if action.help != argparse.SUPPRESS for flag in action.option_strings}


@pytest.fixture(scope="module")
def every_parser():
    return parsers()


def test_every_command_that_talks_to_a_server_takes_its_key_and_tls(every_parser):
    talking = {name for name, parser in every_parser.items() if "--server" in visible_flags(parser)}
    assert {"generate", "device-server", "bench report", "bench capacity", "bench links", "bench sampling"} <= talking
    for name in sorted(talking):
        missing = {"--api-key", "--tls", "--ca-cert"} - visible_flags(every_parser[name])
        assert not missing, f"edgespec {name} talks to a server but has no {sorted(missing)}"


def test_no_command_shows_a_retired_spelling(every_parser):
    for name, parser in every_parser.items():
        assert not visible_flags(parser) & RETIRED, f"edgespec {name}: {sorted(visible_flags(parser) & RETIRED)}"


def test_each_bench_mode_has_only_its_own_flags(every_parser):
    assert "--temperatures" in visible_flags(every_parser["bench sampling"])
    assert "--temperatures" not in visible_flags(every_parser["bench capacity"])
    assert "--ingresses" not in visible_flags(every_parser["bench links"])
    assert "--server" not in visible_flags(every_parser["bench load"])  # it starts and watches its own server


@pytest.mark.parametrize("mode", ["load", "ingress", "simcheck", "overhead"])
def test_a_fixed_k_mode_refuses_auto_cleanly(mode, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["bench", mode, "--k", "auto"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--k" in err and "auto" in err and "Traceback" not in err


def test_tls_without_a_server_is_refused(capsys):
    assert main(["bench", "capacity", "--tls", "--target", "/nonexistent"]) == 2
    assert "--tls/--ca-cert are for --server" in capsys.readouterr().err


def test_old_spellings_still_parse_with_a_warning(every_parser, capsys):
    args = every_parser["simulate"].parse_args(["--k-max", "8", "--batch-wait-ms", "5", "--profile-mix", "4g"])
    assert (args.max_k, args.batch_wait_timeout_s, args.link_mix) == (8, 0.005, "4g")
    args = every_parser["bench"].parse_args(["links", "--profiles", "wifi", "--target", "t"])
    assert args.links == "wifi"
    args = every_parser["serve"].parse_args(["--model", "m", "--torch-threads", "3"])
    assert args.torch_threads == 3
    args = every_parser["evaluate"].parse_args(["--target", "t", "--draft", "d", "--new-tokens", "7"])
    assert args.max_new_tokens == 7
    args = every_parser["link"].parse_args(["--listen", "1", "--upstream", "h:2", "--profile", "wifi"])
    assert args.link == "wifi"
    assert capsys.readouterr().err.count("is deprecated: use") == 7


def test_bench_without_a_mode_runs_the_report(capsys):
    assert main(["bench", "--target", "/nonexistent"]) == 2  # parsed as `bench report`, then refused
    err = capsys.readouterr().err
    assert "running `edgespec bench report`" in err and "--target" in err
