"""The argument helpers every `hetflow` command and every benchmark share: the strict parser, the
recipe and strategy flags, `--recipe-option`'s parsing.

This module imports the standard library and `hetflow.errors` (the one-line error, which
imports nothing) and nothing else, so that a benchmark or a command takes its flags from here
without importing the CLI's commands, the config models or anything below them
(tests/unit/test_layout.py holds it so). What a flag's choices and defaults are comes from the
caller (`choices(TrainConfig, "strategy")`, `BUILTIN_RECIPES`): the models stay the one place
that says them.

`Parser` is argparse's with three differences. Options are never abbreviated (`--speed` is not
`--speeds`). A bad command line raises `UsageError` (a one-line `ConfigError` naming the
command) instead of printing usage and exiting, so that `hetflow`'s `main` reports it as it
reports every other bad input. A mistyped option, command or choice gets the closest valid one:
"did you mean --speeds?". Its help shows each option's default.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import get_args

from hetflow.errors import ConfigError, suggestion


class UsageError(ConfigError):
    """A command line the parser refuses; the message is one line."""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, unless it has none to show (None, a flag)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.nargs == 0:
            return action.help
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """argparse.ArgumentParser, strict: no abbreviations, no unknown arguments, errors raised.

    `parse_known_args` refuses unknown arguments too: a subcommand's parser is called through
    it, and only there are the options known that a typo should be compared with. A command
    that takes another program's flags takes them as `nargs=argparse.REMAINDER`.
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            options = [o for a in self._actions for o in a.option_strings]
            first = next((e for e in extras if e.startswith("-")), extras[0])
            hint = suggestion(first.split("=", 1)[0], options) if first.startswith("-") else ""
            self.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return namespace, extras

    def _check_value(self, action: argparse.Action, value) -> None:
        # argparse's own check (a private hook, stable in 3.11), with a suggestion
        if action.choices is not None and value not in action.choices:
            listed = ", ".join(map(str, action.choices))
            hint = suggestion(str(value), action.choices)
            raise argparse.ArgumentError(
                action, f"invalid choice: {value!r} (choose from {listed}){hint}"
            )

    def error(self, message: str):
        """Raise UsageError: argparse's message, then `(see `hetflow demo --help`)`."""
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def choices(model: type, field: str) -> tuple[str, ...]:
    """The values of a model's Literal field, e.g. ('ddp', 'fsdp', 'diloco') of
    `choices(TrainConfig, "strategy")` (read from the annotation: nothing imported here)."""
    return get_args(model.model_fields[field].annotation)


def _recipes(builtin: Iterable[str]) -> str:
    """'a, b, c' of the built-in recipes, or where to find them when none are given."""
    return ", ".join(builtin) or "a built-in recipe (`hetflow demo --help` lists them)"


def add_recipe_arg(p: argparse.ArgumentParser, default: str, builtin: Iterable[str] = ()) -> None:
    """--recipe (a built-in name, listed from `builtin`, or package.module:Name), repeatable
    --recipe-option KEY=VALUE, and --model refused in one line (`recipe_flag`)."""
    p.add_argument(
        "--recipe",
        default=default,
        help=f"the model and loss: {_recipes(builtin)}, or the import path "
        "package.module:Name of your own Recipe class",
    )
    p.add_argument(
        "--recipe-option",
        action="append",
        default=[],
        dest="recipe_option",
        metavar="KEY=VALUE",
        help="an option of the recipe, e.g. n_layer=2 (repeatable)",
    )
    p.add_argument("--model", help=argparse.SUPPRESS)


def recipe_options(args) -> dict[str, int | float | str]:
    """--recipe-option KEY=VALUE flags as a dict, numbers as numbers.

    >>> recipe_options(argparse.Namespace(recipe_option=["n_layer=2", "dropout=0.1", "a=b"]))
    {'n_layer': 2, 'dropout': 0.1, 'a': 'b'}
    """
    out: dict[str, int | float | str] = {}
    for item in getattr(args, "recipe_option", None) or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--recipe-option: expected KEY=VALUE (got {item!r})")
        for kind in (int, float, str):
            try:
                out[key.strip()] = kind(value)
                break
            except ValueError:
                continue
    return out


def recipe_flag(args, builtin: Iterable[str] = ()) -> str:
    """--recipe's value; a one-line error for --model, which it replaced."""
    if getattr(args, "model", None) is not None:
        raise ConfigError(
            f"--model: replaced by --recipe (one of {_recipes(builtin)}, or package.module:Name)"
        )
    return args.recipe


def add_strategy_arg(p: argparse.ArgumentParser, strategies: Iterable[str], default: str) -> None:
    """--strategy (`TrainConfig.strategy`: its `choices` and default, from the caller)."""
    p.add_argument(
        "--strategy",
        choices=tuple(strategies),
        default=default,
        help="ddp: every worker holds the whole model; fsdp: parameters, gradients and "
        "optimizer state sharded across the workers (torch's FSDP2), plain all-reduce only; "
        "diloco: rounds of local steps by speed, then one weighted outer step (the demo "
        "compares them with the sized synchronous run)",
    )
