"""The shape of the code: layers import downward only, modules fit on a few screens, functions
do one thing. These are the habits docs/architecture.md describes, checked on every run."""

from __future__ import annotations

import ast
import itertools
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# folder -> the hetflow subpackage it installs as (pyproject's package-dir)
FOLDERS = {
    "hetflow": "hetflow",
    "flows": "hetflow.flows",
    "tasks": "hetflow.tasks",
    "training": "hetflow.training",
    "infra": "hetflow.infra",
    "emulation": "hetflow.emulation",
}
# What each layer may import of hetflow (besides itself). The CLI and the stack (under hetflow/)
# sit on top and may import anything.
ALLOWED = {
    "hetflow.errors": set(),  # the one-line error (`ConfigError`): imports nothing
    "hetflow.figures": set(),  # the run's figures: records, at the bottom with them
    "hetflow.methods": set(),  # the compression method as a parsed value: pure
    "hetflow.records": {"hetflow.figures", "hetflow.methods"},
    "hetflow.config.base": {"hetflow.errors", "hetflow.emulation"},
    "hetflow.config.dataset": {"hetflow.config.base"},
    "hetflow.config.cluster": {"hetflow.config.base", "hetflow.emulation"},
    "hetflow.config.recommend": {"hetflow.config.base"},
    "hetflow.config.faults": {"hetflow.config.base"},
    "hetflow.config.diloco": {"hetflow.config.base"},
    # the rules across models (the models' types for type checkers only)
    "hetflow.config.rules": {"hetflow.config.base", "hetflow.config.diloco"},
    "hetflow.config.queue": {
        "hetflow.config.base",
        "hetflow.config.cluster",
        "hetflow.config.train",
        "hetflow.emulation",
    },
    # the job's section, over the sections it holds
    "hetflow.config.train": {
        "hetflow.records",
        "hetflow.config.base",
        "hetflow.config.cluster",
        "hetflow.config.diloco",
        "hetflow.config.faults",
        "hetflow.config.recommend",
    },
    # the package: re-exports the sections' names (`from hetflow.config import TrainConfig`)
    "hetflow.config": {
        "hetflow.records",
        "hetflow.config.base",
        "hetflow.config.dataset",
        "hetflow.config.cluster",
        "hetflow.config.recommend",
        "hetflow.config.faults",
        "hetflow.config.diloco",
        "hetflow.config.rules",
        "hetflow.config.train",
    },
    "hetflow.emulation": set(),
    # the performance model: pure, at the bottom; the plan, the forecast and the queue call it
    "hetflow.perf": {"hetflow.errors"},
    "hetflow.output": set(),  # a command's JSON file and wide console: no hetflow below it
    "hetflow.repeats": set(),  # the order of a round's variants, a figure's median: pure
    # the profile history's records and keys (`hetflow.history`), beside the config
    "hetflow.history": {"hetflow.records", "hetflow.config"},
    # where the history's entries are stored and which are fresh: over S3 (`infra.s3`)
    "hetflow.history.store": {
        "hetflow.history",
        "hetflow.records",
        "hetflow.config",
        "hetflow.infra",
    },
    "hetflow.infra": {"hetflow.figures", "hetflow.records", "hetflow.config", "hetflow.emulation"},
    "hetflow.training": {
        "hetflow.figures",
        "hetflow.records",
        "hetflow.config",
        "hetflow.history",
        "hetflow.emulation",
        "hetflow.infra",
        "hetflow.perf",
    },
    # the forecast room: pure, above training (it may use the plan), below the tasks
    "hetflow.forecast": {
        "hetflow.figures",
        "hetflow.records",
        "hetflow.config",
        "hetflow.history",
        "hetflow.emulation",
        "hetflow.output",
        "hetflow.perf",
        "hetflow.training",
    },
    "hetflow.tasks": {
        "hetflow.config.queue",
        "hetflow.queue",
        "hetflow.figures",
        "hetflow.records",
        "hetflow.config",
        "hetflow.history",
        "hetflow.history.store",
        "hetflow.infra",
        "hetflow.forecast",
        "hetflow.perf",
        "hetflow.training",
    },
    # the queue's allocator and replay: pure, over the performance model's balanced step
    "hetflow.queue": {"hetflow.perf", "hetflow.training"},
    "hetflow.flows": {
        "hetflow.repeats",
        "hetflow.config.queue",
        "hetflow.queue",
        "hetflow.figures",
        "hetflow.records",
        "hetflow.config",
        "hetflow.history",
        "hetflow.history.store",
        "hetflow.infra",
        "hetflow.tasks",
    },
}
MAX_MODULE_LINES = 450  # a concept that needs 450 lines is one file, not two
MAX_FUNCTION_LINES = 60


def sources() -> list[tuple[str, Path]]:
    """(dotted module name, file) of every installed module."""
    out = []
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out.append((".".join((package, *parts)), path))
    return out


def benchmark_sources() -> list[tuple[str, Path]]:
    """(dotted module name, file) of every benchmark: not installed and not a layer (they may
    import anything), but held to the same sizes as the installed modules."""
    out = []
    for path in sorted((ROOT / "benchmarks").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out.append((".".join(parts[:-1] if parts[-1] == "__init__" else parts), path))
    return out


def tool_sources() -> list[tuple[str, Path]]:
    """(dotted module name, file) of the repository's own tools (`tools/`): not installed."""
    return [(f"tools.{p.stem}", p) for p in sorted((ROOT / "tools").glob("*.py"))]


def sized() -> list[tuple[str, Path]]:
    """Every module the size rule covers: the installed ones, the benchmarks and the tools."""
    return sources() + benchmark_sources() + tool_sources()


def layer(module: str) -> str | None:
    """The entry of ALLOWED that governs `module` (the longest matching prefix), if any."""
    matches = [k for k in ALLOWED if module == k or module.startswith(k + ".")]
    return max(matches, key=len) if matches else None


def hetflow_imports(tree: ast.AST) -> set[str]:
    """The hetflow modules a module imports at run time (imports for type checkers only, under
    `if TYPE_CHECKING:`, create no dependency)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            node.body = []
    return {n for n in all_imports(tree) if n == "hetflow" or n.startswith("hetflow.")}


@pytest.mark.parametrize("module, path", sources(), ids=[m for m, _ in sources()])
def test_layers_import_downward_only(module, path):
    own = layer(module)
    if own is None:
        return  # the top: CLI, stack
    bad = sorted(
        name
        for name in hetflow_imports(ast.parse(path.read_text()))
        if layer(name) not in ALLOWED[own] | {own}
    )
    assert not bad, f"{module} ({own}) imports {bad}"


def all_imports(tree: ast.AST) -> set[str]:
    """Every module a module imports (at run time or not): a room kept pure is kept so for
    type checkers too."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


# The layers from the top down: each may import those below it, none above it.
LAYER_ORDER = (
    "hetflow.cli",
    "hetflow.flows",
    "hetflow.tasks",
    "hetflow.forecast",
    "hetflow.training",
    "hetflow.infra",
)


def test_no_layer_may_import_one_above_it():
    for i, upper in enumerate(LAYER_ORDER):
        for lower in LAYER_ORDER[i + 1 :]:
            assert upper not in ALLOWED[lower], f"{lower} may import {upper}, above it"
    for upper, lower in itertools.pairwise(LAYER_ORDER[1:]):
        assert lower in ALLOWED[upper], f"{upper} may not import {lower}, just below it"


# The pure rooms: no torch, no infra (hetflow's or the outside world's clients), anywhere in a
# module (at the top, inside a function, or for type checkers), and of `training` only the plan
# (the rest brings torch).
PURE_ROOMS = ("hetflow.perf", "hetflow.training.plan", "hetflow.forecast")
PLAN = "hetflow.training.plan"
INFRA = (
    "hetflow.infra",
    "torch",
    "boto3",
    "botocore",
    "s3fs",
    "fsspec",
    "mlflow",
    "prefect",
    "ray",
)


def impure(names: set[str]) -> list[str]:
    """The imports among `names` a pure room may not make."""
    return sorted(
        n
        for n in names
        if any(n == bad or n.startswith(bad + ".") for bad in INFRA)
        or (n.startswith("hetflow.training") and not n.startswith(PLAN))
    )


def pure_sources() -> list[tuple[str, Path]]:
    return [(m, p) for m, p in sources() if m.startswith(PURE_ROOMS)]


@pytest.mark.parametrize("module, path", pure_sources(), ids=[m for m, _ in pure_sources()])
def test_the_pure_rooms_import_no_infra_and_no_torch(module, path):
    """The plan and the forecast import neither torch, nor infra, nor the rest of `training`."""
    bad = impure(all_imports(ast.parse(path.read_text())))
    assert not bad, f"{module} imports {bad}"


def test_the_purity_rule_sees_an_import_inside_a_function():
    tree = ast.parse(
        "def f():\n    from hetflow.infra.catalog import load_snapshot\n"
        "    import torch.nn\n    from hetflow.training.plan.balance import balance_batches\n"
        "if TYPE_CHECKING:\n    from hetflow.training.loop import step\n"
    )
    assert impure(all_imports(tree)) == [
        "hetflow.infra.catalog",
        "hetflow.training.loop",
        "torch.nn",
    ]


QUEUE_ROOM = "hetflow.queue"
PERF = "hetflow.perf"


@pytest.mark.parametrize(
    "module, path",
    [(m, p) for m, p in sources() if m.startswith(QUEUE_ROOM)],
    ids=[m for m, _ in sources() if m.startswith(QUEUE_ROOM)],
)
def test_the_queue_room_is_pure(module, path):
    """The allocator imports no torch, Prefect or MLflow, and of hetflow only itself and the
    plan (pure)."""
    bad = sorted(
        n
        for n in all_imports(ast.parse(path.read_text()))
        if n.split(".")[0] in {"torch", "prefect", "mlflow", "boto3", "s3fs"}
        or (n.startswith("hetflow") and not n.startswith((QUEUE_ROOM, PERF, PLAN)))
    )
    assert not bad, f"{module} imports {bad}"


def test_the_layer_rule_catches_an_upward_import():
    tree = ast.parse(
        "from hetflow.tasks.train import train_variant\nimport hetflow.records\n"
        "if TYPE_CHECKING:\n    from hetflow.flows.train import train"
    )
    assert layer("hetflow.tasks.train") not in ALLOWED["hetflow.training"]
    assert hetflow_imports(tree) == {"hetflow.tasks.train", "hetflow.records"}


@pytest.mark.parametrize("module, path", sized(), ids=[m for m, _ in sized()])
def test_modules_and_functions_stay_small(module, path):
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{module}: {len(text.splitlines())} lines"
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{module}: {long}"


def test_the_size_rule_covers_the_benchmarks_and_the_layer_rule_does_not():
    sized_names = {module for module, _ in sized()}
    assert {
        "benchmarks",
        "benchmarks.hetero",
        "benchmarks.hetero.model",
        "benchmarks.comm",
    } <= sized_names
    assert not [module for module, _ in sources() if module.startswith("benchmarks")]


# Modules whose docstrings must hold no lab notes: their figures, dates and issue numbers live
# in docs/measurements/; a docstring states the contract.
CONTRACT_DOCSTRINGS = (
    "hetflow/forecast/rent/search.py",
    "hetflow/forecast/rent/spot.py",
    "hetflow/forecast/simulate/models.py",
    "hetflow/forecast/rent/measured.py",
    "hetflow/forecast/rent/rental.py",
    "hetflow/forecast/rent/spot_table.py",
    "hetflow/forecast/rent/recommend.py",
    "hetflow/forecast/rent/table.py",
    "infra/market.py",
    "hetflow/config/recommend.py",
    "hetflow/cli/recommend.py",
    "tasks/recommend.py",
    "flows/recommend.py",
    "emulation/costs.py",
)


@pytest.mark.parametrize("path", CONTRACT_DOCSTRINGS)
def test_docstrings_state_contracts_not_lab_notes(path):
    from tests.helpers.cli.cli import LAB_NOTE

    tree = ast.parse((ROOT / path).read_text())
    documented = [tree] + [
        n for n in ast.walk(tree) if isinstance(n, ast.ClassDef | ast.FunctionDef)
    ]
    notes = [
        f"{getattr(n, 'name', 'module')}: {m.group(0)!r}"
        for n in documented
        for m in LAB_NOTE.finditer(ast.get_docstring(n) or "")
    ]
    assert not notes, f"{path}: {notes} (move them to docs/measurements/)"


def test_every_package_folder_is_installed():
    """pyproject lists every package explicitly (package-dir maps folders onto `hetflow`), the
    benchmarks' included: a folder missing there would be absent from a wheel while an
    editable install still finds it."""
    import tomllib

    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    packages = sources() + benchmark_sources()
    found = {module for module, path in packages if path.name == "__init__.py"}
    assert found == listed, (
        f"not listed: {sorted(found - listed)}; listed, not found: {sorted(listed - found)}"
    )


ROOMS = [
    "hetflow/perf",
    "hetflow/forecast/simulate",
    "hetflow/forecast/rent",
    "hetflow/queue",
    "training/loop",
    "training/launch",
    "training/comm",
]


@pytest.mark.parametrize("room", ROOMS)
def test_the_architecture_page_names_every_module_of_a_room(room):
    page = (ROOT / "docs" / "architecture.md").read_text()
    modules = sorted(p.stem for p in (ROOT / room).glob("*.py") if p.stem != "__init__")
    assert [m for m in modules if f"`{m}`" not in page and f"`{m}.py`" not in page] == []


def test_no_flow_module_shadows_the_standard_library():
    """Prefect loads a deployment's entrypoint (`flows/x.py:flow`) by path and puts its folder
    on `sys.path`: a `flows/queue.py` would then be what `import queue` finds in that process
    and in every process it spawns."""
    flows = Path(__file__).resolve().parents[2] / "flows"
    shadows = sorted(p.stem for p in flows.glob("*.py") if p.stem in sys.stdlib_module_names)
    assert not shadows, f"flows/ modules named like the standard library's: {shadows}"


# Import loops left, each with why; every other strongly connected component is a failure.
ALLOWED_LOOPS: set[frozenset[str]] = set()  # an import loop left would be named here, with why


def import_graph(modules: list[tuple[str, Path]]) -> dict[str, set[str]]:
    """Each module's imports among `modules`: at run time, inside functions and for type
    checkers alike; `from package import name` counts as the submodule where one is named."""
    names = {m for m, _ in modules}
    graph = {}
    for module, path in modules:
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    edges.add(sub if sub in names else node.module)
            elif isinstance(node, ast.Import):
                edges.update(a.name for a in node.names)
        graph[module] = {e for e in edges if e in names and e != module}
    return graph


def loops(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(comp)
    return out


def test_the_loop_check_sees_imports_for_type_checkers_and_inside_functions():
    texts = {
        "a": "def f():\n    import b\n",
        "b": "if TYPE_CHECKING:\n    from a import T\n",
        "c": "import a\n",
    }
    graph = import_graph([(name, _Source(text)) for name, text in texts.items()])
    assert graph == {"a": {"b"}, "b": {"a"}, "c": {"a"}}
    assert loops(graph) == [{"a", "b"}]
    assert loops({"a": {"b"}, "b": {"c"}, "c": set()}) == []


class _Source:
    """A module's text, as `import_graph` reads a path."""

    def __init__(self, text: str) -> None:
        self.text = text

    def read_text(self) -> str:
        return self.text


def test_no_import_loops():
    """No two modules import each other, through any chain, at run time, inside a function or
    for type checkers (the allowed loops above excepted): a loop means neither can be read,
    tested or moved without the other. The benchmarks included."""
    found = [frozenset(c) for c in loops(import_graph(sources() + benchmark_sources()))]
    assert [sorted(c) for c in found if c not in ALLOWED_LOOPS] == []
    assert [sorted(c) for c in ALLOWED_LOOPS if c not in found] == [], "a loop allowed is gone"


# The tiers: the unit tests (the fast tier, `pytest tests/unit`) and the integration tests,
# those marked slow or started on a server, a process or a cluster (tools/split_tests.py).
TESTS = ROOT / "tests"


def slow_tests(tree: ast.Module) -> list[str]:
    """The tests a module marks `slow`, read from its source: every test under a slow
    `pytestmark`, else each test (function or class) a decorator marks, or a class's method."""

    def slow(node: ast.AST) -> bool:
        marks = [getattr(d, "func", d) for d in getattr(node, "decorator_list", [])]
        if isinstance(node, ast.List | ast.Tuple):
            marks = [getattr(e, "func", e) for e in node.elts]
        elif isinstance(node, ast.Attribute | ast.Call):
            marks = [getattr(node, "func", node)]
        named = any(ast.unparse(m).endswith("mark.slow") for m in marks)
        return named or any(slow(n) for n in getattr(node, "body", []) if hasattr(n, "body"))

    tests = [
        n
        for n in tree.body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and n.name.lower().startswith("test")
    ]
    module = any(
        isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "pytestmark" and slow(n.value)
        for n in tree.body
    )
    return [n.name for n in tests if module or slow(n)]


def test_no_test_under_tests_unit_is_marked_slow():
    found = [
        f"{path.relative_to(ROOT)}::{name}"
        for path in sorted((TESTS / "unit").rglob("test_*.py"))
        for name in slow_tests(ast.parse(path.read_text()))
    ]
    assert not found, f"slow tests in the unit tier (move them to tests/integration): {found}"


def test_the_slow_rule_sees_a_module_mark_a_decorator_and_a_class():
    marked = ast.parse("pytestmark = [pytest.mark.slow, pytest.mark.timeout(9)]\ndef test_a(): ...")
    assert slow_tests(marked) == ["test_a"]
    tree = ast.parse(
        "pytestmark = pytest.mark.timeout(9)\n@pytest.mark.slow\ndef test_a(): ...\n"
        "def test_b(): ...\n@pytest.mark.parametrize('x', [1])\ndef test_c(x): ...\n"
        "class TestD:\n    @pytest.mark.slow\n    def test_e(self): ...\n"
    )
    assert slow_tests(tree) == ["test_a", "TestD"]


def test_once_split_every_test_module_sits_in_a_tier():
    """After `python -m tools.split_tests --apply`, no test module is left at an old place."""
    if not (TESTS / "unit").is_dir():
        pytest.skip("the tests are not split into tests/unit and tests/integration yet")
    tiers = (TESTS / "unit", TESTS / "integration")
    left = [
        str(p.relative_to(ROOT))
        for p in sorted(TESTS.rglob("test_*.py"))
        if not any(t in p.parents for t in tiers)
    ]
    assert not left, f"test modules outside tests/unit and tests/integration: {left}"


# The CLI's argument helpers, which the commands and the benchmarks share: of hetflow, only the
# one-line error (`hetflow.errors`, which imports nothing of hetflow's itself).
ARGS = "hetflow.cli.args"
ARGS_MAY_IMPORT = {"hetflow.errors"}


def stdlib(name: str) -> bool:
    return name.split(".")[0] in sys.stdlib_module_names or name == "__future__"


@pytest.mark.parametrize("module", [ARGS, *sorted(ARGS_MAY_IMPORT)])
def test_the_argument_helpers_import_only_the_standard_library(module):
    path = dict(sources())[module]
    bad = sorted(
        n
        for n in all_imports(ast.parse(path.read_text()))
        if not stdlib(n) and (module != ARGS or n not in ARGS_MAY_IMPORT)
    )
    assert not bad, f"{module} imports {bad}"


def test_importing_the_argument_helpers_loads_nothing_else():
    """At run time too: the `hetflow.cli` package they live in imports its commands only when
    its parser is built, so a benchmark that imports `hetflow.cli.args` loads no config model,
    no pydantic and no command module."""
    import subprocess

    code = (
        "import sys; before = set(sys.modules); import hetflow.cli.args; "
        "print('\\n'.join(sorted(set(sys.modules) - before)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.split()
    assert {m for m in out if m.startswith("hetflow")} == {
        "hetflow",
        "hetflow.cli",
        ARGS,
        *ARGS_MAY_IMPORT,
    }
    assert [m for m in out if not m.startswith("hetflow") and not stdlib(m)] == []


def test_the_benchmarks_take_of_the_cli_only_its_argument_helpers():
    """A benchmark defines its flags with `hetflow.cli.args`; the CLI's command modules (the
    job's validation, the recommend command) are the CLI's own."""
    bad = {
        module: sorted(
            n
            for n in all_imports(ast.parse(path.read_text()))
            if n.startswith("hetflow.cli") and n != ARGS
        )
        for module, path in benchmark_sources()
    }
    assert {m: names for m, names in bad.items() if names} == {}


def test_every_benchmark_with_a_main_runs_as_a_module():
    """`python -m benchmarks.X`: a module that defines `main` calls it under a main guard, a
    package's `main` has a `__main__.py` beside it."""

    def guarded(tree: ast.Module) -> bool:
        return any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body)

    missing = []
    for module, path in benchmark_sources():
        tree = ast.parse(path.read_text())
        if not any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body):
            continue
        ok = (
            (path.parent / "__main__.py").is_file() if path.name == "__init__.py" else guarded(tree)
        )
        if not ok:
            missing.append(module)
    assert missing == []
