"""Every `hetflow ...` command in the README and docs/ parses as written: the command exists and
takes the flags shown (`hetflow bench NAME` and `hetflow simulate` by their own parsers). They
are parsed, not run: some need a GPU, a Ray cluster or many cores."""

from __future__ import annotations

import importlib
import shlex
from pathlib import Path

import pytest

from hetflow.cli import UsageError, build_parser

ROOT = Path(__file__).resolve().parents[3]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


SHELL = ("```bash", "```sh", "```shell", "```console")


def commands(text: str) -> list[str]:
    """The `hetflow` commands of the shell blocks in `text`, each joined across its backslash
    continuations, comments and `$ ` prompts dropped, one per `&&` or `;` part.
    """
    out, fenced, pending = [], False, ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("```"):
            fenced, pending = (not fenced and line.startswith(SHELL)), ""
            continue
        if not fenced:
            continue
        line = pending + line.removeprefix("$ ")
        if line.endswith("\\"):
            pending = line[:-1].strip() + " "
            continue
        pending = ""
        line = line.split(" #", 1)[0]
        parts = [p.strip() for chunk in line.split("&&") for p in chunk.split(";")]
        out += [p for p in parts if p.startswith("hetflow ")]
    return out


def bench_parser(name: str, rest: list[str]):
    """What parses `hetflow bench NAME`'s flags: its argparse parser, or for `data` its module,
    whose `parse_args` is argparse alone (no check that needs the host)."""
    if name == "hetero":
        from benchmarks.hetero.args import parser

        return parser()
    if name == "comm":
        from benchmarks.comm import _parser

        return _parser()
    if name != "data":  # the others: their module's own `parser`
        return importlib.import_module(f"benchmarks.{name}").parser()
    if "--train" in rest:
        from benchmarks import data_train

        return data_train
    from benchmarks import data

    return data


def parse(line: str) -> None:
    """Parse `line` as `hetflow` would, down to the benchmark's or simulator's own flags."""
    argv = shlex.split(line)[1:]
    if argv[:1] == ["simulate"]:
        from hetflow.cli.simulate import build_parser as simulate_parser

        simulate_parser().parse_args(argv[1:])
        return
    args = build_parser().parse_args(argv)
    if args.command == "bench":
        rest = [a for a in args.rest if a != "--train"]
        bench_parser(args.name, args.rest).parse_args(rest)  # a parser, or a module's function


CASES = [(page, line) for page in PAGES for line in commands(page.read_text())]


def test_commands_are_read_from_shell_blocks_across_continuations_and_parts():
    text = (
        "```bash\nhetflow demo \\\n  --steps 5  # short\nls && hetflow stack up\n```\n"
        "```\nhetflow demo / Prefect UI\n```\nhetflow outside"
    )
    assert commands(text) == ["hetflow demo --steps 5", "hetflow stack up"]


def test_the_pages_hold_commands_to_check():
    assert len(CASES) > 40 and {p.name for p, _ in CASES} >= {"README.md", "benchmarks.md"}


@pytest.mark.parametrize(
    "page, line", CASES, ids=[f"{p.relative_to(ROOT)}:{line[:60]}" for p, line in CASES]
)
def test_a_documented_command_parses(page, line):
    try:
        parse(line)
    except SystemExit as e:  # --help exits 0
        assert e.code == 0, f"{page.relative_to(ROOT)}: `{line}` does not parse"
    except UsageError as e:
        pytest.fail(f"{page.relative_to(ROOT)}: `{line}` does not parse: {e}")


def test_a_command_with_a_flag_that_does_not_exist_is_caught():
    with pytest.raises(UsageError, match="--no-such-flag"):
        parse("hetflow bench hetero --speeds 1,2 --no-such-flag")
    with pytest.raises(UsageError, match="--stepz"):
        parse("hetflow demo --stepz 5")


@pytest.mark.parametrize("name", ["host", "noise", "lr_rule", "diloco", "queue"])
def test_a_benchmark_s_help_opens_with_a_whole_sentence(name):
    """Those whose help opens with their module's first sentence, not its first line."""
    description = bench_parser(name, []).description
    assert description.endswith("."), description
