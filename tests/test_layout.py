"""The shape of the code: layers import downward only, modules fit on a few screens, functions
do one thing. These are the habits docs/architecture.md describes, checked on every run."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# folder -> the hetflow subpackage it installs as (pyproject's package-dir)
FOLDERS = {
    "hetflow": "hetflow",
    "flows": "hetflow.flows",
    "tasks": "hetflow.tasks",
    "training": "hetflow.training",
    "infra": "hetflow.infra",
    "emulation": "hetflow.emulation",
}
# What each layer may import of hetflow (besides itself). The CLI, the stack and the simulator
# (under hetflow/) sit on top and may import anything.
ALLOWED = {
    "hetflow.figures": set(),  # the run's figures: records, at the bottom with them
    "hetflow.records": {"hetflow.figures"},
    "hetflow.config_base": {"hetflow.emulation"},
    "hetflow.config_dataset": {"hetflow.config_base"},
    "hetflow.config_cluster": {"hetflow.config_base", "hetflow.emulation"},
    "hetflow.config_recommend": {"hetflow.config_base"},
    "hetflow.config_faults": {"hetflow.config_base"},
    "hetflow.config": {
        "hetflow.records",
        "hetflow.config_base",
        "hetflow.config_dataset",
        "hetflow.config_cluster",
        "hetflow.config_recommend",
        "hetflow.config_faults",
    },
    "hetflow.emulation": set(),
    # the profile history's records and keys (`hetflow.history`), beside the config
    "hetflow.history": {"hetflow.records", "hetflow.config"},
    "hetflow.infra": {"hetflow.figures", "hetflow.records", "hetflow.config", "hetflow.emulation"},
    "hetflow.training": {
        "hetflow.figures",
        "hetflow.records",
        "hetflow.config",
        "hetflow.history",
        "hetflow.emulation",
        "hetflow.infra",
    },
    "hetflow.tasks": {
        "hetflow.figures",
        "hetflow.records",
        "hetflow.config",
        "hetflow.history",
        "hetflow.infra",
        "hetflow.training",
    },
    "hetflow.flows": {
        "hetflow.figures",
        "hetflow.records",
        "hetflow.config",
        "hetflow.history",
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


def sized() -> list[tuple[str, Path]]:
    """Every module the size rule covers: the installed ones and the benchmarks."""
    return sources() + benchmark_sources()


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
        return  # the top: CLI, stack, simulator
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


PURE_ROOM = "hetflow.training.plan"


@pytest.mark.parametrize(
    "module, path",
    [(m, p) for m, p in sources() if m.startswith(PURE_ROOM)],
    ids=[m for m, _ in sources() if m.startswith(PURE_ROOM)],
)
def test_the_plan_room_is_pure(module, path):
    """The plan imports neither torch nor the rest of `training` (which would bring torch)."""
    bad = sorted(
        n
        for n in all_imports(ast.parse(path.read_text()))
        if n.split(".")[0] == "torch"
        or (n.startswith("hetflow.training") and not n.startswith(PURE_ROOM))
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
    "training/plan/spot.py",
    "training/plan/models.py",
    "training/plan/recommend.py",
    "training/plan/measured.py",
    "training/plan/rental.py",
    "training/plan/spot_table.py",
    "hetflow/config_recommend.py",
    "hetflow/cli/recommend.py",
    "tasks/recommend.py",
    "flows/recommend.py",
    "emulation/costs.py",
)


@pytest.mark.parametrize("path", CONTRACT_DOCSTRINGS)
def test_docstrings_state_contracts_not_lab_notes(path):
    from tests.test_cli import LAB_NOTE

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
    """pyproject lists every package explicitly (package-dir maps folders onto `hetflow`): a
    folder missing there would be absent from a wheel while an editable install still finds it."""
    import tomllib

    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {module for module, path in sources() if path.name == "__init__.py"}
    assert found == listed, (
        f"not listed: {sorted(found - listed)}; listed, not found: {sorted(listed - found)}"
    )
