"""Helpers both halves of test_cli.py use: tests/unit/cli/test_cli.py and
tests/integration/cli/test_cli.py (and any other test module that imports them)."""

from __future__ import annotations

import re

# What --help and a form's description must not hold: figures of a run (a percentage, a time
# measured "here", a date, an issue number); they belong in docs/measurements/.
LAB_NOTE = re.compile(
    r"\d+(\.\d+)?\s?%|measured here|issue \d+|\b20\d\d-\d\d-\d\d\b|\(\d+(\.\d+)? s\)"
)
