"""What `tools/split_tests.py` moves where, read from the test modules' syntax trees alone.

A test module is cut into top-level chunks: each statement with the comments and blank lines
above it and its decorators, as the source spells them (`ast` node line spans, no regular
expressions). A test (a `test*` function or `Test*` class) is *integration* when it is marked
slow (itself, its class, or the module's `pytestmark`), or when it asks, directly or through
other fixtures, for a fixture that starts a server, a process or a cluster: one whose body calls
a name in `LAUNCHERS`, or a module function that does. Every other test is *unit*.

A module of one kind moves whole. A mixed one is split: each half keeps its tests and the
helpers only its tests reach; a helper both reach, or that another module imports, goes to a
shared helper module with everything it needs, once. Nothing here writes a file.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import PurePosixPath

# Calls that start a server, a process or a cluster (a call's dotted name, or its last part).
LAUNCHERS = frozenset(
    {
        "Popen",
        "subprocess.run",
        "subprocess.check_call",
        "subprocess.check_output",
        "ThreadedMotoServer",
        "prefect_test_harness",
        "run_cli",
        "run_ranks",
        "Cluster",
        "ray.init",
        "FaultProxy",
        "multiprocessing.Process",
    }
)
_UNDOTTED = frozenset(n for n in LAUNCHERS if "." not in n)
UNIT, INTEGRATION, SHARED = "unit", "integration", "shared"


@dataclass
class Chunk:
    """One top-level statement as written. `kind` is docstring, future, import, mark (the
    module's `pytestmark`), test or helper; `uses` holds the names it loads, `params` the
    argument names of its functions (the fixtures it asks for), `strings` its string constants
    (a fixture named in `usefixtures` or `getfixturevalue`)."""

    text: str
    kind: str
    node: ast.stmt
    defines: set[str] = field(default_factory=set)
    uses: set[str] = field(default_factory=set)
    params: set[str] = field(default_factory=set)
    strings: set[str] = field(default_factory=set)
    slow: bool = False
    place: str = ""

    def refs(self, fixtures: set[str] | dict) -> set[str]:
        """The module-level names this chunk needs: those it loads, and the fixtures among its
        arguments and strings."""
        return self.uses | ((self.params | self.strings) & set(fixtures))


@dataclass
class Fixture:
    name: str
    params: set[str]
    launches: bool
    autouse: bool


@dataclass
class Module:
    """A parsed test module: its chunks, fixtures, module functions that launch, and the names
    it imports from other modules (bound name -> (module, name))."""

    path: PurePosixPath
    source: str
    chunks: list[Chunk]
    fixtures: dict[str, Fixture]
    imported: dict[str, tuple[str, str]]

    @property
    def dotted(self) -> str:
        return ".".join(self.path.with_suffix("").parts)


def dotted_name(node: ast.AST) -> str:
    """`a.b.c` of a Name/Attribute chain (a call's function, a decorator); "" otherwise."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def is_slow_mark(node: ast.AST) -> bool:
    """`pytest.mark.slow`, called or not, or a list/tuple holding one."""
    if isinstance(node, ast.List | ast.Tuple):
        return any(is_slow_mark(e) for e in node.elts)
    if isinstance(node, ast.Call):
        node = node.func
    return dotted_name(node).endswith("mark.slow")


def _has_slow_param(node: ast.AST) -> bool:
    """A `pytest.param(..., marks=pytest.mark.slow)` anywhere in the decorators."""
    return any(
        isinstance(n, ast.Call)
        and dotted_name(n.func).endswith("param")
        and any(k.arg == "marks" and is_slow_mark(k.value) for k in n.keywords)
        for n in ast.walk(node)
    )


def _slow_decorated(node: ast.AST) -> bool:
    decorators = getattr(node, "decorator_list", [])
    if any(is_slow_mark(d) or _has_slow_param(d) for d in decorators):
        return True
    if isinstance(node, ast.ClassDef):
        return any(_slow_decorated(n) for n in node.body)
    return False


def _bound(node: ast.stmt) -> set[str]:
    """The module-level names a statement binds."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Import | ast.ImportFrom):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign | ast.For | ast.With):
        targets = getattr(node, "targets", None) or [
            getattr(node, "target", None) or node.items[0].optional_vars
        ]
        names = {n.id for t in targets if t for n in ast.walk(t) if isinstance(n, ast.Name)}
        inner = node.body if isinstance(node, ast.For | ast.With) else []
        return names.union(*(_bound(s) for s in inner))
    bodies = [getattr(node, k, []) for k in ("body", "orelse", "finalbody")]
    bodies += [h.body for h in getattr(node, "handlers", [])]
    return set().union(*(_bound(s) for body in bodies for s in body))


def _kind(node: ast.stmt, first: bool) -> str:
    if first and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        return "docstring"
    if isinstance(node, ast.ImportFrom) and node.module == "__future__":
        return "future"
    if isinstance(node, ast.Import | ast.ImportFrom):
        return "import"
    if isinstance(node, ast.Assign) and [dotted_name(t) for t in node.targets] == ["pytestmark"]:
        return "mark"
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
        return "test"
    if isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
        return "test"
    return "helper"


def _chunk(node: ast.stmt, text: str, first: bool) -> Chunk:
    walked = list(ast.walk(node))
    functions = [n for n in walked if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    return Chunk(
        text=text,
        kind=_kind(node, first),
        node=node,
        defines=_bound(node),
        uses={n.id for n in walked if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)},
        params={a.arg for f in functions for a in f.args.args + f.args.kwonlyargs},
        strings={n.value for n in walked if isinstance(n, ast.Constant) and type(n.value) is str},
        slow=_slow_decorated(node),
    )


def chunks_of(source: str) -> list[Chunk]:
    """The module's top-level statements, each with the comments above it and its decorators;
    comments after the last statement stay with it."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    out, start = [], 0
    for i, node in enumerate(tree.body):
        end = len(lines) if i == len(tree.body) - 1 else node.end_lineno
        text = "".join(lines[start:end]).lstrip("\n")
        out.append(_chunk(node, text.rstrip() + "\n", i == 0))
        start = end
    return out


def _calls(node: ast.AST) -> set[str]:
    return {dotted_name(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)} - {""}


def _launching_functions(chunks: list[Chunk]) -> set[str]:
    """Module functions that call a launcher, directly or through other module functions."""
    calls = {
        c.node.name: _calls(c.node)
        for c in chunks
        if isinstance(c.node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    found: set[str] = set()
    while True:
        more = {
            name
            for name, called in calls.items()
            if name not in found
            and any(c in LAUNCHERS or c.rsplit(".", 1)[-1] in _UNDOTTED | found for c in called)
        }
        if not more:
            return found
        found |= more


def _fixture_decorator(node: ast.AST) -> ast.AST | None:
    for d in getattr(node, "decorator_list", []):
        if dotted_name(d.func if isinstance(d, ast.Call) else d).endswith("fixture"):
            return d
    return None


def fixtures_of(chunks: list[Chunk]) -> dict[str, Fixture]:
    launching = _launching_functions(chunks)
    out = {}
    for c in chunks:
        decorator = _fixture_decorator(c.node)
        if decorator is None:
            continue
        autouse = isinstance(decorator, ast.Call) and any(
            k.arg == "autouse" and getattr(k.value, "value", False) for k in decorator.keywords
        )
        args = {a.arg for a in c.node.args.args + c.node.args.kwonlyargs}
        out[c.node.name] = Fixture(c.node.name, args, c.node.name in launching, autouse)
    return out


def _imported(chunks: list[Chunk]) -> dict[str, tuple[str, str]]:
    return {
        (a.asname or a.name): (c.node.module, a.name)
        for c in chunks
        if isinstance(c.node, ast.ImportFrom) and c.node.module and c.node.level == 0
        for a in c.node.names
    }


def parse_module(path: PurePosixPath, source: str) -> Module:
    chunks = chunks_of(source)
    return Module(path, source, chunks, fixtures_of(chunks), _imported(chunks))


def module_pytestmark_slow(module: Module) -> bool:
    return any(c.kind == "mark" and is_slow_mark(c.node.value) for c in module.chunks)


def _fixture_calls(chunk: Chunk) -> set[str]:
    """Fixtures a test names as strings: `usefixtures("x")`, `getfixturevalue("x")`."""
    out = set()
    for n in ast.walk(chunk.node):
        if isinstance(n, ast.Call) and dotted_name(n.func).endswith(
            ("usefixtures", "getfixturevalue")
        ):
            out |= {a.value for a in n.args if isinstance(a, ast.Constant)}
    return out


class Fixtures:
    """A fixture name resolved as pytest resolves it for a module: the module's own, one it
    imports from another test module, then the conftests above it (nearest first)."""

    def __init__(self, modules: dict[str, Module], conftests: list[Module]) -> None:
        self.modules = modules
        self.conftests = conftests

    def visible(self, module: Module) -> list[Module]:
        return [module] + [c for c in self.conftests if module.path.is_relative_to(c.path.parent)]

    def lookup(self, module: Module, name: str) -> tuple[Fixture | None, Module]:
        for home in self.visible(module):
            if name in home.fixtures:
                return home.fixtures[name], home
            source = home.imported.get(name)
            if source and source[0] in self.modules:
                other = self.modules[source[0]]
                if source[1] in other.fixtures:
                    return other.fixtures[source[1]], other
        return None, module

    def launches(self, module: Module, name: str, seen: frozenset = frozenset()) -> bool:
        """Whether fixture `name`, as `module` sees it, starts a server, process or cluster,
        itself or through the fixtures it asks for."""
        fixture, home = self.lookup(module, name)
        if fixture is None or (home.path, name) in seen:
            return False
        seen = seen | {(home.path, name)}
        return fixture.launches or any(self.launches(home, p, seen) for p in fixture.params)

    def autouse(self, module: Module) -> set[str]:
        return {n for home in self.visible(module) for n, f in home.fixtures.items() if f.autouse}


def classify(module: Module, fixtures: Fixtures, by_fixtures: bool = True) -> dict[int, str]:
    """Each test chunk's index -> UNIT or INTEGRATION (by the slow mark alone where not
    `by_fixtures`)."""
    slow_module = module_pytestmark_slow(module)
    auto = fixtures.autouse(module)
    out = {}
    for i, c in enumerate(module.chunks):
        if c.kind != "test":
            continue
        asked = c.params | _fixture_calls(c) | auto
        started = by_fixtures and any(fixtures.launches(module, n) for n in asked)
        out[i] = INTEGRATION if slow_module or c.slow or started else UNIT
    return out


def _providers(chunks: list[Chunk]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i, c in enumerate(chunks):
        if c.kind == "helper":
            for name in c.defines:
                out.setdefault(name, []).append(i)
    return out


def _closure(module: Module, roots: set[int], providers: dict[str, list[int]]) -> set[int]:
    """The helper chunks `roots` need, through the helpers they need in turn (roots kept)."""
    found, todo = set(roots), list(roots)
    while todo:
        c = module.chunks[todo.pop()]
        for name in c.refs(module.fixtures):
            for j in providers.get(name, ()):
                if j not in found:
                    found.add(j)
                    todo.append(j)
    return found


def place(module: Module, kinds: dict[int, str], exported: set[str]) -> None:
    """Set each chunk's `place`: a test its kind; a helper UNIT, INTEGRATION or SHARED (reached
    from both halves' tests, or imported by another module, or needed by such a helper);
    the docstring, imports and `pytestmark` go to every output that needs them."""
    chunks = module.chunks
    providers = _providers(chunks)
    common = {i for i, c in enumerate(chunks) if c.kind == "mark"}
    common |= {i for n, f in module.fixtures.items() if f.autouse for i in providers.get(n, ())}
    reach = {
        kind: _closure(module, {i for i, k in kinds.items() if k == kind} | common, providers)
        for kind in (UNIT, INTEGRATION)
    }
    wanted = {i for name in exported for i in providers.get(name, ())}
    shared = _closure(module, (reach[UNIT] & reach[INTEGRATION]) | wanted, providers)
    for i, c in enumerate(chunks):
        if c.kind == "test":
            c.place = kinds[i]
        elif c.kind != "helper":
            c.place = "all"
        elif i in shared:
            c.place = SHARED
        else:
            c.place = INTEGRATION if i in reach[INTEGRATION] else UNIT
