"""The one-line error every layer raises for a bad value (`ConfigError`), and the "did you
mean" its messages end with (`suggestion`), at the very bottom: it imports nothing of hetflow's
(of the standard library, difflib), so that the pure performance model (`hetflow.perf`) and the
CLI's argument helpers (`hetflow.cli.args`) raise the same error as the config models
(`hetflow.config.base` re-exports both)."""

from __future__ import annotations

import difflib


class ConfigError(ValueError):
    """A bad configuration value: the message is one line and names the field."""


def suggestion(word: str, candidates) -> str:
    """`"; did you mean X?"` for the candidate closest to `word`, or "" if none is close.

    >>> suggestion("--speed", ["--speeds", "--steps"]), suggestion("zzz", ["--speeds"])
    ('; did you mean --speeds?', '')
    """
    close = difflib.get_close_matches(word, [str(c) for c in candidates], n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""
