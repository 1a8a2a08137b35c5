"""The text of each file `tools/split_tests.py` writes: a split module's halves and shared
helpers, imports of moved modules pointed at their new homes, and `Path(__file__)` climbs
re-counted for a file one folder deeper. Edits replace the `ast` node's source span and leave
everything around it (comments, `# noqa`) as written. Nothing here writes a file."""

from __future__ import annotations

import ast
import textwrap
from pathlib import PurePosixPath

from tools.split_plan import SHARED, Module, dotted_name

Symbols = dict[str, "str | dict[str, str]"]  # old module -> new module, or name -> new module


def _offsets(source: str) -> list[int]:
    starts, total = [], 0
    for line in source.splitlines(keepends=True):
        starts.append(total)
        total += len(line)
    return [*starts, total]


def _index(source: str, starts: list[int], line: int, col: int) -> int:
    """A node's (line, UTF-8 byte column) as an index into `source`."""
    text = source[starts[line - 1] : starts[line]] if line <= len(starts) - 1 else ""
    return starts[line - 1] + len(text.encode()[:col].decode(errors="ignore"))


def replace_spans(source: str, edits: list[tuple[ast.AST, str]]) -> str:
    """`source` with each node's span replaced by its text (spans must not overlap)."""
    starts = _offsets(source)
    spans = sorted(
        (
            _index(source, starts, n.lineno, n.col_offset),
            _index(source, starts, n.end_lineno, n.end_col_offset),
            text,
        )
        for n, text in edits
    )
    for start, end, text in reversed(spans):
        source = source[:start] + text + source[end:]
    return source


def _import_text(node: ast.ImportFrom, target: dict[str, str] | str, indent: str) -> str:
    groups: dict[str, list[str]] = {}
    for a in node.names:
        module = target if isinstance(target, str) else target.get(a.name, node.module)
        groups.setdefault(module, []).append(a.name + (f" as {a.asname}" if a.asname else ""))
    return f"\n{indent}".join(f"from {m} import {', '.join(ns)}" for m, ns in groups.items())


def rewrite_imports(source: str, symbols: Symbols) -> str:
    """Every `from <moved module> import ...` (at the top or inside a function) pointed at
    where each name now lives; `import <moved module>` at its new name."""
    edits: list[tuple[ast.AST, str]] = []
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        line = lines[node.lineno - 1] if hasattr(node, "lineno") else ""
        indent = line[: len(line) - len(line.lstrip())]
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in symbols:
            edits.append((node, _import_text(node, symbols[node.module], indent)))
        elif isinstance(node, ast.Import) and any(a.name in symbols for a in node.names):
            names = [
                (symbols[a.name] if isinstance(symbols.get(a.name), str) else a.name)
                + (f" as {a.asname}" if a.asname else "")
                for a in node.names
            ]
            edits.append((node, f"import {', '.join(names)}"))
    return replace_spans(source, edits)


def _climb(node: ast.AST) -> int | None:
    """How many folders `node` climbs from `Path(__file__)` (`.resolve()` allowed): `.parent`
    one, `.parents[k]` k + 1; None for anything else."""
    up = 0
    while True:
        if isinstance(node, ast.Attribute) and node.attr == "parent":
            up, node = up + 1, node.value
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "parents"
            and isinstance(node.slice, ast.Constant)
        ):
            up, node = up + node.slice.value + 1, node.value.value
        else:
            break
    func = getattr(node, "func", None)
    if isinstance(func, ast.Attribute) and func.attr in {"resolve", "absolute"}:
        node = func.value
    if isinstance(node, ast.Call) and node.args and dotted_name(node.func).endswith("Path"):
        arg = node.args[0]
        if isinstance(arg, ast.Name) and arg.id == "__file__" and up:
            return up
    return None


def _climbs(tree: ast.AST) -> list[tuple[ast.AST, int]]:
    """The outermost `Path(__file__)...parent` chains in `tree`."""
    out, todo = [], [tree]
    while todo:
        node = todo.pop()
        up = _climb(node)
        if up is None:
            todo.extend(ast.iter_child_nodes(node))
        else:
            out.append((node, up))
    return out


def rewrite_file_paths(
    source: str, old: PurePosixPath, new: PurePosixPath
) -> tuple[str, list[str]]:
    """Each `Path(__file__)` climb re-counted so that from `new` it reaches the folder it
    reached from `old`; (the text, a warning per climb to a folder that is not above `new`)."""
    edits, warnings = [], []
    for node, up in _climbs(ast.parse(source)):
        target = old.parents[up - 1]
        if target not in new.parents:
            warnings.append(f"{new}:{node.lineno}: Path(__file__) reaches {target}, not above it")
            continue
        depth = list(new.parents).index(target)
        if depth != up - 1:
            edits.append((node, f"Path(__file__).resolve().parents[{depth}]"))
    return replace_spans(source, edits), warnings


def _shared_import(module: str, names: set[str], fixtures: set[str]) -> str:
    """The import of the shared helpers a half uses. A fixture is bound by assignment, not
    imported by name: a test's argument of the same name would read to pyflakes as an unused
    import redefined (F401, F811), where pytest sees the fixture it asks for."""
    plain, bound = sorted(names - fixtures), sorted(names & fixtures)
    out = [f"from {module} import {', '.join(plain)}"] if plain else []
    if bound:
        package, _, leaf = module.rpartition(".")
        out += [f"from {package} import {leaf} as _shared", "", "# the shared fixtures"]
        out += [f"{n} = _shared.{n}" for n in bound]
    return "\n".join(out) + "\n"


def half_text(module: Module, kind: str, shared_module: str) -> str:
    """One half of a split module: the docstring, `__future__`, the imports (ruff drops the
    ones it does not use), `pytestmark`, its own tests and helpers, and one import of the
    shared helpers it needs."""
    own = [c for c in module.chunks if c.place == kind]
    used = set().union(*(c.refs(module.fixtures) for c in own), *[set()])
    shared = {n for c in module.chunks if c.place == SHARED for n in c.defines}
    auto = {n for n, f in module.fixtures.items() if f.autouse}
    wanted = (shared & used) | (shared & auto)
    out, head_done = [], False
    for c in module.chunks:
        if c.place == "all" and c.kind != "mark":
            out.append(c.text)
            continue
        if wanted and not head_done:
            out.append(_shared_import(shared_module, wanted, set(module.fixtures)))
            head_done = True
        if c.place in {kind, "all"}:
            out.append(c.text)
    return "\n\n".join(out)


def shared_text(module: Module, halves: list[PurePosixPath]) -> str:
    """The shared helpers of a split module, under a docstring naming its two halves."""
    said = (
        f"Helpers both halves of {module.path.name} use: {halves[0]} and {halves[1]} (and any "
        "other test module that imports them)."
    )
    doc = '"""' + textwrap.fill(said, width=96) + '"""\n'
    out = [doc]
    for c in module.chunks:
        if c.kind in {"future", "import"} or c.place == SHARED:
            out.append(c.text)
    return "\n\n".join(out)
