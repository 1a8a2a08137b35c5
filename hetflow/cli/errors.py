"""What the CLI reports as bad input in one line, and what it leaves as a bug: read by the
command's entry (`hetflow.cli.main`) and by the log routing (`hetflow.cli.logs`), so that
neither imports the other."""

from __future__ import annotations

import sys

from hetflow.config import ConfigError, alias_note, describe_validation_error

# Errors of bad input raised past validation (a plan the cluster cannot run, a dataset that is
# not there), by module: a module not yet imported cannot have raised its error.
LATER_ERRORS = (
    ("hetflow.training.plan.balance", "PlanError"),
    ("hetflow.infra.data.format", "DatasetError"),
    ("hetflow.stack.layout", "StackError"),
)


def say_alias(flag: str, name: str, aliases: dict[str, str]) -> None:
    """Print on stderr, in one line, what the other command's name of a network means here
    (`hetflow.config.alias_note`); nothing for a name of this command's own."""
    note = alias_note(flag, name, aliases)
    if note:
        print(f"hetflow: note: {note}", file=sys.stderr)


def of_own_records(e: Exception) -> bool:
    """A pydantic error of one of hetflow's own records (a `RunResult`, a `RunMetrics`: what
    the code made, not what a user wrote): a bug, not bad input."""
    from hetflow.figures import _Figures
    from hetflow.records import _Record

    own, todo = set(), [_Record, _Figures]
    while todo:
        cls = todo.pop()
        own.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return getattr(e, "title", None) in own


def one_line(e: Exception) -> str | None:
    """The one-line message of an error of bad input; None for any other error (a bug)."""
    from pydantic import ValidationError

    if isinstance(e, ConfigError):
        return str(e)
    if isinstance(e, ValidationError):
        return None if of_own_records(e) else describe_validation_error(e)
    later = tuple(
        cls
        for module, name in LATER_ERRORS
        if (cls := getattr(sys.modules.get(module), name, None))
    )
    return str(e) if later and isinstance(e, later) else None
