"""Where a flow command's log goes: progress on the terminal, everything in the run's log file.

Prefect reports a failed task or flow through its loggers (`prefect.task_runs`,
`prefect.flow_runs`), whose records reach the console handler of the root logger: for a user
error raised inside a flow (a missing bucket, a Parquet column the files lack) that is 40-57
lines of traceback above the one line the CLI prints, `hetflow: error: ...`.

Prefect 3 reads its whole logging configuration from the file its setting
`PREFECT_LOGGING_SETTINGS_PATH` names, and lets any key of that file be set by a variable
`PREFECT_LOGGING_<PATH>_<TO>_<KEY>` (docs.prefect.io, "How to customize Prefect's logging
configuration"). So a flow command, once its input passed every check and before it imports
Prefect (`route_prefect_logs`), points that setting at a file written here:
`$HETFLOW_HOME/logs/prefect-logging.yml`, Prefect's own default configuration (read from the
installed package, so it follows Prefect's version) with two additions:

- a handler `hetflow_run_log` on the root logger: a FileHandler writing what the console gets,
  tracebacks included, to the command's log file, `$HETFLOW_HOME/logs/COMMAND-STAMP-PID.log`
  (its path in `PREFECT_LOGGING_HANDLERS_HETFLOW_RUN_LOG_FILENAME`, so one configuration file
  serves commands run at once; created on the first record);
- a filter on Prefect's console handler, `ConsoleFilter`, that keeps the records of a user
  error off the terminal (they stay in the log file), and Prefect's line on stopping its
  temporary server at exit, which would come after everything the command printed ("Where to
  look"); everything else, a bug's traceback included, reaches the terminal as before.

What is ours and why: the filter (no Prefect setting tells a user error from a bug), the file
built from Prefect's default (Prefect takes one configuration file whole, not additions to its
own), and `record_user_error`, which writes the error the CLI reports, with its traceback, to
the log file, whose path the one line then names. The variables are in `os.environ`, so the
processes a run starts with it (Prefect's temporary server, torchrun's ranks) log to the same
file. Where the user has a logging configuration of their own (`PREFECT_LOGGING_SETTINGS_PATH`,
`PREFECT_LOGGING_CONFIG_PATH`, or `$PREFECT_HOME/logging.yml`), nothing here is set, and
Prefect prints as that configuration says.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import logging
import os
import re
import sys
from pathlib import Path

import yaml

SETTINGS_VAR = "PREFECT_LOGGING_SETTINGS_PATH"
HANDLER = "hetflow_run_log"
FILENAME_VAR = f"PREFECT_LOGGING_HANDLERS_{HANDLER.upper()}_FILENAME"
FILTER = "hetflow_console"
SERVER_STOP = "Stopping temporary server"  # Prefect's line at exit (its ephemeral server)
CONFIG_NAME = "prefect-logging.yml"

# How Prefect's lines without a traceback name the exception a task or flow failed with:
# "Finished in state Failed('Task run encountered an exception DatasetError: ...')",
# "Task run failed with exception: DatasetError('...') - Retry 1/2 will start ..."
_STATE_EXCEPTION = re.compile(r"(?:encountered an exception:? |failed with exception: )(\w+)[:(]")


def user_error_types() -> tuple[type, ...]:
    """hetflow's exception types of bad input (`hetflow.cli.errors.one_line`), with their
    subclasses, among the modules imported so far."""
    from pydantic import ValidationError

    from hetflow.cli.errors import LATER_ERRORS
    from hetflow.config import ConfigError

    later = [getattr(sys.modules.get(m), name, None) for m, name in LATER_ERRORS]
    return (ConfigError, ValidationError, *[c for c in later if c is not None])


def _names(types: tuple[type, ...]) -> set[str]:
    names, todo = set(), list(types)
    while todo:
        cls = todo.pop()
        if cls.__name__ not in names:
            names.add(cls.__name__)
            todo.extend(cls.__subclasses__())
    return names


class ConsoleFilter(logging.Filter):
    """On Prefect's console handler: drops the records of a user error, which the CLI reports
    in one line at the end: those carrying it (a task's or flow's "failed with exception" and
    its traceback) and Prefect's lines naming its type ("Finished in state Failed('Task run
    encountered an exception DatasetError: ...')", a retry's "Task run failed with exception:
    DatasetError(...)"); and "Stopping temporary server", logged at exit after the command's
    last lines. Any other record passes, an unexpected exception's traceback too. The log file
    keeps every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith(SERVER_STOP):
            return False
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            from hetflow.cli.errors import of_own_records

            return not isinstance(exc, user_error_types()) or of_own_records(exc)
        if record.name.startswith(("prefect.task_runs", "prefect.flow_runs")):
            found = _STATE_EXCEPTION.search(record.getMessage())
            if found and found.group(1) in _names(user_error_types()):
                return False
        return True


def _prefect_default() -> dict:
    """Prefect's default logging configuration, read without importing Prefect."""
    spec = importlib.util.find_spec("prefect")
    path = Path(next(iter(spec.submodule_search_locations))) / "logging" / "logging.yml"
    return yaml.safe_load(path.read_text())


def prefect_config() -> dict:
    """Prefect's default configuration with the run's log file and the console's filter.

    Its `${...}` placeholders stay as they are: Prefect fills them in when it loads the file."""
    config = _prefect_default()
    config.setdefault("filters", {})[FILTER] = {"()": f"{__name__}.ConsoleFilter"}
    console = config["handlers"]["console"]
    console["filters"] = [*console.get("filters", []), FILTER]
    config["handlers"][HANDLER] = {
        "level": 0,
        "class": "logging.FileHandler",
        "formatter": "standard",
        "filename": os.devnull,  # the command's own, from FILENAME_VAR
        "delay": True,
        "encoding": "utf-8",
    }
    root = config.setdefault("root", {"level": "WARNING", "handlers": []})
    root["handlers"] = [*root.get("handlers", []), HANDLER]
    return config


def user_has_config() -> bool:
    """Whether the user set a logging configuration of their own for Prefect."""
    if os.environ.get(SETTINGS_VAR) or os.environ.get("PREFECT_LOGGING_CONFIG_PATH"):
        return True
    prefect_home = os.environ.get("PREFECT_HOME") or "~/.prefect"
    return (Path(prefect_home).expanduser() / "logging.yml").exists()


def route_prefect_logs(command: str) -> Path | None:
    """Before Prefect is imported: its logging configured to write the run's log file and to
    keep user errors off the terminal (the module's docstring); the log file's path. None
    where Prefect is already imported (its logging is set) or the user has a configuration."""
    from hetflow.infra.paths import home

    if "prefect" in sys.modules or user_has_config():
        return None
    folder = home() / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / CONFIG_NAME
    tmp = folder / f".{CONFIG_NAME}.{os.getpid()}"
    tmp.write_text(yaml.safe_dump(prefect_config(), sort_keys=False))
    os.replace(tmp, config)  # whole, for a command starting at the same time
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    log = folder / f"{command}-{stamp}-{os.getpid()}.log"
    os.environ[SETTINGS_VAR] = str(config)
    os.environ[FILENAME_VAR] = str(log)
    return log


def record_user_error(error: BaseException, message: str) -> Path | None:
    """The user error the CLI reports in one line, with its traceback, written to the run's
    log file; that file's path. None where this process has no run log (Prefect was not
    configured by `route_prefect_logs`, or was never imported: the error came before any
    flow, and its line says all)."""
    handler = next((h for h in logging.getLogger().handlers if h.get_name() == HANDLER), None)
    if handler is None or not isinstance(handler, logging.FileHandler):
        return None
    logging.getLogger("hetflow.cli").error(
        "the command ends with: %s", message, exc_info=(type(error), error, error.__traceback__)
    )
    handler.flush()
    path = Path(handler.baseFilename)
    return path if path.exists() else None
