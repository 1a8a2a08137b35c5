"""The argument parser of every `hetflow` command: strict, one-line errors, suggestions.

`Parser` is argparse's with three differences. Options are never abbreviated (`--speed` is not
`--speeds`). A bad command line raises `UsageError` (a one-line `ConfigError` naming the
command) instead of printing usage and exiting, so that `hetflow`'s `main` reports it as it
reports every other bad input. A mistyped option, command or choice gets the closest valid one:
"did you mean --speeds?". Its help shows each option's default.
"""

from __future__ import annotations

import argparse

from hetflow.config import ConfigError
from hetflow.config.base import suggestion


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
