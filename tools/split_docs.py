"""The prose and configuration that follow the split: test paths quoted anywhere in the
repository, and the fast tier's command (`pytest tests/unit`) in README, the docs and pyproject.

A path to a moved module becomes its new path; to a split one, its half when a test is named
(`tests/x/test_y.py::test_z`), else both halves in the shell's brace form
(`tests/{unit,integration}/x/test_y.py`, which bash expands for a command). The measurement
pages are records of runs at a commit and keep the paths of their time.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tools.split_plan import INTEGRATION, UNIT

TEXT_SUFFIXES = {".md", ".py", ".toml", ".yml", ".yaml", ".txt", ".cfg", ".ini", ""}
KEPT = ("docs/measurements/", "tools/split_")  # records of their time; this tool's own text

# (file, what the text says before the split, what it says after): whitespace in the first
# matches any run of whitespace, so a re-wrapped paragraph is still found.
EDITS = [
    (
        "README.md",
        '`pytest -m "not slow"` leaves out the tests that launch torchrun or servers and answers '
        "in under 3 minutes; the tests sit in a folder per room (`pytest tests/queue` runs one).",
        "`pytest tests/unit` runs the unit tests alone (none launches torchrun or a server) and "
        "answers in a few minutes; `pytest tests/integration` runs the rest; each holds a folder "
        "per room (`pytest tests/unit/queue` runs one).",
    ),
    (
        "docs/quickstart.md",
        '`pytest -m "not slow"` leaves out the tests that launch torchrun or servers and answers '
        "in a few minutes;",
        "`pytest tests/unit` runs the unit tests alone (none launches torchrun or a server) and "
        "answers in a few minutes;",
    ),
    (
        "docs/architecture.md",
        "`tests/` holds one file per behaviour area, in a folder per room:",
        "`tests/unit/` holds the unit tests (the fast tier, `pytest tests/unit`) and "
        "`tests/integration/` those that are marked `slow` or ask for a fixture that starts a "
        "server, a process or a cluster (`tools/split_tests.py` sorts them; "
        "`tests/integration/conftest.py` marks them all `slow`); helpers the two halves of a "
        "room's module share sit in `tests/helpers/`. Each holds one file per behaviour area, "
        "in a folder per room:",
    ),
    (
        "docs/architecture.md",
        "repeats stay at the top. A room's folder runs alone (`pytest tests/training`).",
        "repeats sit at the top of `tests/unit/`. A room's folder runs alone "
        "(`pytest tests/unit/training`).",
    ),
    (
        "docs/architecture.md",
        'torchrun or servers are marked `slow` (`pytest -m "not slow"` leaves them out), those',
        "torchrun or servers are marked `slow` and sit under `tests/integration/` (no test under "
        "`tests/unit/` is, `test_layout.py` checks), those",
    ),
    (
        "pyproject.toml",
        '"slow: launches torchrun or servers (seconds to a minute each)",',
        '"slow: launches torchrun or servers (seconds to a minute each); every test under '
        'tests/integration",',
    ),
]


def _pattern(text: str) -> re.Pattern:
    return re.compile(r"\s+".join(re.escape(word) for word in text.split()))


def apply_edits(root: Path) -> list[str]:
    """Each edit where its old text is found; a warning where neither text is."""
    warnings = []
    for name, old, new in EDITS:
        path = root / name
        if not path.exists():
            continue
        text = path.read_text()
        changed, n = _pattern(old).subn(new.replace("\\", r"\\"), text)
        if n:
            path.write_text(changed)
        elif not _pattern(new).search(text):
            warnings.append(f"{name}: neither the old nor the new text of an edit; edit by hand")
    return warnings


def _targets(moves) -> dict[str, tuple[str, dict[str, str]]]:
    """old path -> (its new path or brace form, test name -> its half's path)."""
    out = {}
    for m in moves:
        paths = {k: str(p) for k, p in m.kinds.items()}
        if len(paths) == 1:
            out[str(m.module.path)] = (next(iter(paths.values())), {})
            continue
        rest = "/".join(m.module.path.parts[1:])
        tests = {
            c.node.name: paths[c.place] for c in m.module.chunks if c.place in {UNIT, INTEGRATION}
        }
        out[str(m.module.path)] = (f"tests/{{unit,integration}}/{rest}", tests)
    return out


def _tracked(root: Path) -> list[str]:
    files = subprocess.run(
        ["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.split()
    return [f for f in files if Path(f).suffix in TEXT_SUFFIXES and not f.startswith(KEPT)]


def rewrite_references(root: Path, moves) -> list[str]:
    """Paths of moved test modules quoted in tracked text files, pointed at their new homes."""
    targets = _targets(moves)
    if not targets:
        return []
    pattern = re.compile(
        r"(?<![\w/])(" + "|".join(map(re.escape, sorted(targets, key=len, reverse=True))) + r")"
        r"(::(\w+))?"
    )

    def new(match: re.Match) -> str:
        path, tests = targets[match.group(1)]
        return tests.get(match.group(3) or "", path) + (match.group(2) or "")

    warnings = []
    for name in _tracked(root):
        path = root / name
        try:
            text = path.read_text()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        changed = pattern.sub(new, text)
        if changed != text:
            path.write_text(changed)
            if name.endswith(".py") and "tests/{unit,integration}/" in changed:
                warnings.append(f"{name}: quotes a split module as tests/{{unit,integration}}/")
    return warnings
