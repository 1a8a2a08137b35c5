"""The command line as a new user meets it: one-line errors, no abbreviations, suggestions for
typos, defaults in the help, and bad input refused before Prefect, MLflow or torch load."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from hetflow.cli import build_parser, main
from hetflow.config import DEFAULT_SPEEDS, TrainConfig

from tests.helpers.cli.cli import LAB_NOTE


def _refused(argv: list[str], capsys) -> str:
    """main(argv) returns 2 and writes one line, `hetflow: error: ...`: that line."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("hetflow: error: ") and len(err.splitlines()) == 1, err
    assert captured.out == ""
    return err


def test_compare_before_anything_was_recorded_creates_no_store(capsys, hetflow_home):
    err = _refused(["compare", "abc", "def"], capsys)
    assert "no runs 'abc' and 'def' in MLflow" in err
    assert not (hetflow_home / "mlflow.db").exists()


# -- abbreviations and typos --------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, meant",
    [
        (["demo", "--speed", "1,2"], "--speeds"),
        (["demo", "--sppeds", "1,2"], "--speeds"),
        (["demo", "--global-bach=64"], "--global-batch"),
        (["train", "--vari", "baseline"], "--variant"),
        (["data", "ingest", "--shard", "3"], "--shard-samples"),
        (["dmeo"], "demo"),
        (["data", "ingset"], "ingest"),
        (["stack", "stauts"], "status"),
        (["demo", "--recipe", "digits-cn"], "digits-cnn"),
        (["bench", "hetero", "--speed", "1,2"], "--speeds"),
        (["simulate", "--mi", "g5.xlarge:2"], "--mix"),
    ],
)
def test_abbreviations_and_typos_are_refused_with_a_suggestion(argv, meant, capsys, hetflow_home):
    err = _refused(argv, capsys)
    assert f"did you mean {meant}?" in err
    assert not (hetflow_home / "runs").exists()  # nothing was launched


def test_an_argument_nothing_is_close_to_gets_no_suggestion(capsys):
    err = _refused(["demo", "--zzzzzz"], capsys)
    assert "unrecognized arguments: --zzzzzz" in err and "did you mean" not in err


def test_a_missing_command_is_one_line_too(capsys):
    assert "required: COMMAND" in _refused([], capsys)


# -- help ---------------------------------------------------------------------------------------


def _parsers(parser: argparse.ArgumentParser):
    """The parser and every subcommand's parser under it, depth first."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_every_option_and_argument_has_help():
    for parser in _parsers(build_parser()):
        for action in parser._actions:
            assert action.help, f"{parser.prog}: {action.option_strings or action.dest}"
        assert parser.description, parser.prog


def test_no_option_states_its_default_twice():
    """The formatter appends '(default: X)' unless the help says '%(default)' itself: a help
    that writes its default out by hand read '(default 24 ...) (default: 24.0)'."""
    for parser in _parsers(build_parser()):
        for action in parser._actions:
            text = parser._get_formatter()._expand_help(action)
            where = f"{parser.prog} {'/'.join(action.option_strings) or action.dest}: {text}"
            assert text.lower().count("default") <= 1, where


def test_help_states_contracts_not_lab_notes():
    """Figures of a run (a percentage, a time measured 'here', a date, an issue number) belong
    in docs/measurements/, not in --help."""
    for parser in _parsers(build_parser()):
        for text in [parser.description or ""] + [
            parser._get_formatter()._expand_help(a) for a in parser._actions if a.help
        ]:
            assert not LAB_NOTE.search(text), f"{parser.prog}: {text}"


@pytest.mark.parametrize("command", ["demo", "train", "profile"])
def test_help_shows_the_defaults_of_the_config_models(command, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")  # no option's help wraps
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    lines: dict[str, str] = {}  # each option's entry: its line and, if on its own, its help's
    option = None
    for line in capsys.readouterr().out.splitlines():
        if line.startswith("  -"):
            option = line.split()[0]
            lines[option] = line
        elif option and line.startswith("   "):
            lines[option] += line
    train = TrainConfig()
    speeds = ",".join(f"{s:g}" for s in DEFAULT_SPEEDS)
    assert f"(default: {speeds}" in lines["--speeds"]
    assert f"(default: {train.steps})" in lines["--steps"]
    assert f"(default: {train.recipe})" in lines["--recipe"]
    assert f"(default: {train.global_batch})" in lines["--global-batch"]
    assert f"(default: {train.seed})" in lines["--seed"]


# -- nothing heavy before the input is valid ----------------------------------------------------

BAD_INPUT = [
    ["demo", "--speeds", "1,0"],
    ["demo", "--speed", "1,2"],
    ["demo", "--recipe", "resnet9000"],
    ["demo", "--model", "cnn"],
    ["demo", "--speeds", "1,1,1", "--global-batch", "2"],
    ["train", "--steps", "0"],
    ["profile", "--cluster", "/nonexistent/cluster.yaml"],
    ["data", "ingest", "--url", "bucket/without/scheme"],
    ["demo", "--dataset-url", "nowhere"],
]


def test_bad_input_is_refused_before_prefect_mlflow_or_torch_are_imported(hetflow_home):
    code = (
        "import json, sys\n"
        "from hetflow.cli import main\n"
        f"codes = [main(argv) for argv in {BAD_INPUT!r}]\n"
        "heavy = [m for m in ('torch', 'prefect', 'mlflow') if m in sys.modules]\n"
        "print(json.dumps({'codes': codes, 'heavy': heavy}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out == {"codes": [2] * len(BAD_INPUT), "heavy": []}
    assert len(proc.stderr.splitlines()) == len(BAD_INPUT)  # one line each
