"""The prose and configuration that follow the split: test paths quoted anywhere in the
repository, and the fast tier's command (`pytest tests/unit`) in README, the docs and pyproject.

A path to a moved module becomes its new path; to a split one, its half when a test is named
(`tests/x/test_y.py::test_z`), else both halves in the shell's brace form
(`tests/{unit,integration}/x/test_y.py`, which bash expands for a command). The measurement
pages are records of runs at a commit and keep the paths of their time.
"""

from __future__ import annotations

import io
import re
import subprocess
import textwrap
import tokenize
from pathlib import Path

HOMES = ("unit", "integration")
LINE = 100  # ruff's line-length
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
        if n and name.endswith(".md"):
            changed = reflow(changed, _pattern(new))
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
        tests = {c.node.name: paths[c.place] for c in m.module.chunks if c.kind == "test"}
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
        path = tests.get(match.group(3) or "", path)
        quoted = match.string[match.start() - 1 : match.start()] == match.string[match.end()]
        if quoted and match.string[match.end()] in "\"'" and "{" in path:
            q = match.string[match.end()]  # a quoted path alone: both halves, as two strings
            line = match.string[: match.start()].rsplit("\n", 1)[-1]
            indent = " " * (len(line) - len(line.lstrip()))
            path = f"{q},\n{indent}{q}".join(path.replace("{unit,integration}", h) for h in HOMES)
        return path + (match.group(2) or "")

    warnings = []
    for name in _tracked(root):
        path = root / name
        try:
            text = path.read_text()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        changed = pattern.sub(new, text)
        if changed == text:
            continue
        if name.endswith(".py"):
            changed, long = rewrap(changed, set(text.splitlines()))
            warnings += [f"{name}:{n}: longer than {LINE} characters; wrap by hand" for n in long]
        path.write_text(changed)
    return warnings


def _lexed(text: str) -> tuple[set[int], dict[int, int]]:
    """(the line numbers, from 1, inside a string of several lines (a docstring); line number
    -> the column of the comment on it)."""
    strings, comments = set(), {}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.STRING and tok.end[0] > tok.start[0]:
            strings |= set(range(tok.start[0], tok.end[0] + 1))
        elif tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.start[1]
    return strings, comments


def _split(line: str, prefix: str) -> list[str]:
    """`line` cut at its last space within the limit, the rest under `prefix`, repeatedly."""
    out = []
    while len(line) > LINE and " " in line[len(prefix) + 1 : LINE + 1]:
        cut = line.rindex(" ", len(prefix) + 1, LINE + 1)
        out.append(line[:cut].rstrip())
        line = prefix + line[cut + 1 :]
    return [*out, line]


def rewrap(text: str, unchanged: set[str]) -> tuple[str, list[int]]:
    """Lines a longer path made too long, cut: a comment continues as a comment (one after
    code goes above it), a line of a docstring at its indentation; (the text, the numbers of
    code lines still too long)."""
    strings, comments = _lexed(text)
    out, long = [], []
    for n, line in enumerate(text.splitlines(), 1):  # n: the line in `text`, for the lexing
        if len(line) <= LINE or line in unchanged:
            out.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip())]
        if n in comments:
            code, comment = line[: comments[n]].rstrip(), line[comments[n] :]
            out += _split(indent + comment, indent + "# ") + ([code] if code.strip() else [])
        elif n in strings:
            out += _split(line, indent)
        else:
            out.append(line)
        if len(out[-1]) > LINE:
            long.append(len(out))
    return "\n".join(out) + ("\n" if text.endswith("\n") else ""), long


def reflow(text: str, pattern: re.Pattern) -> str:
    """Each prose paragraph of a Markdown page that `pattern` matches, filled to the line
    length again (lists, tables, headings, quotes and code left as they are)."""
    paragraphs = re.split(r"(\n\s*\n)", text)
    for i, para in enumerate(paragraphs):
        lines = para.splitlines()
        prose = lines and not any(
            line.lstrip().startswith(("|", "- ", "* ", "```", "#", ">")) for line in lines
        )
        if prose and pattern.search(para) and not lines[0].startswith("    "):
            filled = textwrap.fill(
                " ".join(para.split()), LINE, break_long_words=False, break_on_hyphens=False
            )
            paragraphs[i] = filled + ("\n" if para.endswith("\n") else "")
    return "".join(paragraphs)
