"""Move every test into tests/unit/<room>/ or tests/integration/<room>/.

    python -m tools.split_tests            # the plan: what moves where, nothing written
    python -m tools.split_tests --apply    # do it (git mv, writes, ruff), then review `git status`

Integration tests are those marked slow (the test, its class or its module) and those that ask
for a fixture that starts a server, a process or a cluster (tools/split_plan.py says how that is
read; `--marks-only` leaves these in unit); unit tests are the rest. A module of one kind moves
with `git mv`; a mixed one is split (the larger half keeps the file's history), the helpers both
halves use going to tests/helpers/<room>/<name>.py. Imports of moved modules, `Path(__file__)`
climbs, paths quoted in the docs and the fast tier's command follow. Top-level tests go to
tests/unit/ itself.

Re-runnable: test modules already under tests/unit, tests/integration or tests/helpers are left
alone, so a second run moves only modules added at the old places since, and a run with nothing
left to move changes nothing. Written here rather than taken from a library: no tool splits
pytest modules by marker and fixture, and the pieces (ast, git, ruff) are the well-kept ones.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from tools import split_docs
from tools.split_plan import (
    INTEGRATION,
    LAUNCHERS,
    SHARED,
    UNIT,
    Fixtures,
    Module,
    classify,
    dotted_name,
    parse_module,
    place,
)
from tools.split_render import half_text, rewrite_file_paths, rewrite_imports, shared_text

ROOT = Path(__file__).resolve().parents[1]
NEW_HOMES = ("unit", "integration", "helpers")
INTEGRATION_CONFTEST = '''"""Every test under tests/integration is marked `slow`, whatever its own
marks: the folder is the tier, so `pytest -m "not slow"` and `pytest tests/unit` select the
same tests."""

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items):
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.slow)
'''


@dataclass
class Move:
    """Where one test module goes: `kinds` maps each kind it holds to its new path."""

    module: Module
    kinds: dict[str, PurePosixPath]
    shared: PurePosixPath | None
    counts: dict[str, int]


def new_path(old: PurePosixPath, home: str) -> PurePosixPath:
    return PurePosixPath("tests", home, *old.parts[1:])


def shared_path(old: PurePosixPath) -> PurePosixPath:
    name = old.stem.removeprefix("test_") + ".py"
    return PurePosixPath("tests", "helpers", *old.parts[1:-1], name)


def dotted(path: PurePosixPath) -> str:
    return ".".join(path.with_suffix("").parts)


def _is_old_place(rel: PurePosixPath) -> bool:
    return len(rel.parts) < 3 or rel.parts[1] not in NEW_HOMES


def discover(root: Path) -> tuple[dict[str, Module], list[Module]]:
    """The test modules still at their old places, and every conftest under tests/."""
    modules, conftests = {}, []
    for path in sorted((root / "tests").rglob("*.py")):
        rel = PurePosixPath(path.relative_to(root).as_posix())
        if "__pycache__" in rel.parts:
            continue
        if rel.name == "conftest.py":
            conftests.append(parse_module(rel, path.read_text()))
        elif rel.name.startswith("test_") and _is_old_place(rel):
            module = parse_module(rel, path.read_text())
            modules[module.dotted] = module
    conftests.sort(key=lambda m: -len(m.path.parts))
    return modules, conftests


def python_files(root: Path) -> list[Path]:
    """The Python files that may import a test module: the tests' and the benchmarks'."""
    found = [*(root / "tests").rglob("*.py"), *(root / "benchmarks").rglob("*.py")]
    return sorted(p for p in found if "__pycache__" not in p.parts)


def exported(root: Path, modules: dict[str, Module]) -> dict[str, set[str]]:
    """Names other files import from each test module."""
    out: dict[str, set[str]] = {name: set() for name in modules}
    for path in python_files(root):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in modules:
                out[node.module] |= {a.name for a in node.names}
    return out


def plan(root: Path, by_fixtures: bool = True) -> tuple[list[Move], dict, list[str]]:
    """(the moves, old module -> new module or name -> new module, warnings)."""
    modules, conftests = discover(root)
    fixtures = Fixtures(modules, conftests)
    wanted = exported(root, modules)
    moves, symbols, warnings = [], {}, []
    for name, module in modules.items():
        kinds = classify(module, fixtures, by_fixtures)
        counts = {k: list(kinds.values()).count(k) for k in (UNIT, INTEGRATION)}
        held = [k for k in (UNIT, INTEGRATION) if counts[k]] or [UNIT]
        targets = {k: new_path(module.path, k) for k in held}
        warnings += _launching_unit_tests(module, kinds)
        if len(held) == 1:
            moves.append(Move(module, targets, None, counts))
            symbols[name] = dotted(targets[held[0]])
            continue
        place(module, kinds, wanted[name])
        shared = shared_path(module.path)
        homes = {**{k: dotted(p) for k, p in targets.items()}, SHARED: dotted(shared)}
        symbols[name] = {
            n: homes.get(c.place, homes[UNIT]) for c in module.chunks for n in c.defines
        }
        if not any(c.place == SHARED for c in module.chunks):
            shared = None
        moves.append(Move(module, targets, shared, counts))
    return moves, symbols, warnings


def _launching_unit_tests(module: Module, kinds: dict[int, str]) -> list[str]:
    """Unit tests that call a launcher in their own body (not through a fixture): left in
    unit, named so that someone may mark them slow."""
    out = []
    for i, kind in kinds.items():
        node = module.chunks[i].node
        calls = {dotted_name(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)}
        hit = sorted(c for c in calls if c in LAUNCHERS or c.rsplit(".", 1)[-1] in LAUNCHERS)
        if kind == UNIT and hit:
            out.append(f"{module.path}::{node.name} stays unit but calls {', '.join(hit)}")
    return out


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


def _package(root: Path, rel: PurePosixPath) -> None:
    """Make every folder from tests/ down to `rel`'s a package (an empty __init__.py)."""
    for parent in list(rel.parents)[:-2]:
        init = root / parent / "__init__.py"
        if not init.exists():
            init.parent.mkdir(parents=True, exist_ok=True)
            init.write_text("")
            git(root, "add", str(parent / "__init__.py"))


def _write(root: Path, rel: PurePosixPath, text: str, old: PurePosixPath) -> list[str]:
    text, warnings = rewrite_file_paths(text, old, rel)
    _package(root, rel)
    (root / rel).write_text(text)
    git(root, "add", str(rel))
    return warnings


def apply_move(root: Path, move: Move) -> list[PurePosixPath]:
    """Carry out one move; the files written."""
    old = move.module.path
    if move.shared is None and len(move.kinds) == 1:
        (new,) = move.kinds.values()
        _package(root, new)
        git(root, "mv", str(old), str(new))
        _write(root, new, (root / new).read_text(), old)
        return [new]
    shared_mod = dotted(move.shared) if move.shared else ""
    texts = {new: half_text(move.module, k, shared_mod) for k, new in move.kinds.items()}
    keeper = max(texts, key=lambda p: len(texts[p]))  # the larger half keeps the history
    _package(root, keeper)
    git(root, "mv", str(old), str(keeper))
    if move.shared:
        texts[move.shared] = shared_text(move.module, list(move.kinds.values()))
    for new, text in texts.items():
        _write(root, new, text, old)
    return list(texts)


def apply(root: Path, moves: list[Move], symbols: dict) -> list[str]:
    """Every move, then imports, conftests, docs, and ruff on what was written; warnings."""
    written = [p for move in moves for p in apply_move(root, move)]
    for path in python_files(root):
        text = path.read_text()
        new = rewrite_imports(text, symbols)
        if new != text:
            path.write_text(new)
            written.append(PurePosixPath(path.relative_to(root).as_posix()))
    conftest = PurePosixPath("tests/integration/conftest.py")
    if moves and not (root / conftest).exists():
        _package(root, conftest)
        (root / conftest).write_text(INTEGRATION_CONFTEST)
        git(root, "add", str(conftest))
    warnings = _room_conftests(root) + _drop_empty_rooms(root)
    warnings += split_docs.rewrite_references(root, moves)
    warnings += split_docs.apply_edits(root)
    _ruff(root, sorted(set(map(str, written)) | {str(conftest)}))
    git(root, "add", "-A")
    return warnings


def _room_conftests(root: Path) -> list[str]:
    """A conftest of an old room folder goes to the unit room, a copy to the integration one."""
    out = []
    for path in sorted((root / "tests").glob("*/conftest.py")):
        rel = PurePosixPath(path.relative_to(root).as_posix())
        if rel.parts[1] in NEW_HOMES:
            continue
        text = path.read_text()
        for home in (INTEGRATION, UNIT):
            target = new_path(rel, home)
            if (root / target.parent).exists() and not (root / target).exists():
                (root / target).write_text(text)
                git(root, "add", str(target))
        git(root, "rm", "-q", str(rel))
        out.append(f"{rel}: copied to the unit and integration rooms; check both need it")
    return out


def _drop_empty_rooms(root: Path) -> list[str]:
    """Remove the old room folders left with only their __init__.py."""
    out = []
    for init in sorted((root / "tests").glob("*/__init__.py")):
        room = init.parent
        if room.name in NEW_HOMES:
            continue
        tracked = subprocess.run(
            ["git", "ls-files", str(room.relative_to(root))],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        if len(tracked) == 1:
            git(root, "rm", "-q", str(init.relative_to(root)))
        elif any(re.search(r"/test_[^/]*\.py$", t) for t in tracked):
            out.append(f"{room.relative_to(root)}: test modules left behind")
    return out


def _ruff(root: Path, files: list[str]) -> None:
    """ruff on the files written: unused imports out, imports sorted, formatted."""
    files = [f for f in files if (root / f).exists()]
    if not files:
        return
    ruff = [sys.executable, "-m", "ruff"]
    for step in (
        ["check", "--fix", "-q", "--select", "F401,I001"],
        ["format", "-q"],
    ):
        subprocess.run([*ruff, *step, *files], cwd=root, check=False, capture_output=True)


def _dirty(root: Path) -> bool:
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, check=True
    )
    return bool(status.stdout.strip())


def report(moves: list[Move], warnings: list[str]) -> str:
    lines = []
    for m in moves:
        kinds = ", ".join(f"{m.counts[k]} {k}" for k in (UNIT, INTEGRATION) if m.counts[k])
        targets = " + ".join(str(p) for p in m.kinds.values())
        shared = f" + {m.shared}" if m.shared else ""
        lines.append(f"{m.module.path} ({kinds}) -> {targets}{shared}")
    mixed = sum(len(m.kinds) > 1 for m in moves)
    lines.append(f"{len(moves)} modules to move, {mixed} of them split")
    return "\n".join(lines + [f"warning: {w}" for w in warnings])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--apply", action="store_true", help="move the files (default: plan)")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository's root")
    parser.add_argument(
        "--marks-only",
        action="store_true",
        help="integration = marked slow only; a test on a server fixture stays unit",
    )
    args = parser.parse_args(argv)
    if not (args.root / "tests").is_dir():
        parser.error(f"--root: no tests/ folder in {args.root}")
    if args.apply and _dirty(args.root):
        parser.error(f"--apply: {args.root} has uncommitted changes; commit or stash them first")
    moves, symbols, warnings = plan(args.root, not args.marks_only)
    if args.apply:
        warnings += apply(args.root, moves, symbols)
    print(report(moves, warnings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
