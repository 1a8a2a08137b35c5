"""`tools/split_tests.py`: which tests are integration, how a mixed module is cut (each half its
tests and helpers, the helpers both use shared once), and how imports, `Path(__file__)` climbs
and quoted paths follow; the whole run on a small repository, twice."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

from tools import split_docs, split_tests
from tools.split_plan import INTEGRATION, SHARED, UNIT, Fixtures, classify, parse_module, place
from tools.split_render import half_text, rewrite_file_paths, rewrite_imports, shared_text

CONFTEST = """
import subprocess
import pytest


def _serve():
    return subprocess.Popen(["true"])


@pytest.fixture(scope="session")
def server():
    yield _serve()


@pytest.fixture
def client(server, tmp_path):
    return tmp_path


@pytest.fixture
def home(tmp_path):
    return tmp_path
"""

MIXED = '''"""A room's module of both kinds."""

from __future__ import annotations

import os

import pytest

# the figure both halves check
ANSWER = 42


def _answer() -> int:
    return ANSWER


def _only_slow() -> str:
    return os.sep


@pytest.fixture
def doubled():
    return 2 * _answer()


def exported_helper() -> int:
    return 1


def test_unit_uses_both(home, doubled):
    assert _answer() == ANSWER and doubled == 84


@pytest.mark.slow
def test_marked_slow(doubled):
    assert _only_slow()


def test_started_on_a_server(client):
    assert client


@pytest.mark.parametrize("x", [1, 2])
def test_unit_alone(x):
    assert x
'''

IMPORTER = """from tests.room.test_mixed import exported_helper


def test_imports_a_helper_of_a_split_module():
    assert exported_helper() == 1
"""

CLIMB = """from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_finds_the_root():
    assert (ROOT / "README.md").exists()
"""


def _module(path: str, source: str):
    return parse_module(PurePosixPath(path), source)


def _fixtures(module):
    conftest = _module("tests/conftest.py", CONFTEST)
    return Fixtures({module.dotted: module}, [conftest])


def _kinds(module) -> dict[str, str]:
    return {module.chunks[i].node.name: k for i, k in classify(module, _fixtures(module)).items()}


def test_a_test_is_integration_when_marked_slow_or_started_on_a_server_through_fixtures():
    assert _kinds(_module("tests/room/test_mixed.py", MIXED)) == {
        "test_unit_uses_both": UNIT,
        "test_marked_slow": INTEGRATION,
        "test_started_on_a_server": INTEGRATION,  # client -> server -> _serve -> Popen
        "test_unit_alone": UNIT,
    }


def test_a_slow_module_mark_or_fixture_by_name_makes_every_test_integration():
    slow = _module(
        "tests/room/test_s.py",
        "import pytest\npytestmark = [pytest.mark.slow]\ndef test_a(home): ...\n",
    )
    named = _module(
        "tests/room/test_n.py",
        "import pytest\n@pytest.mark.usefixtures('server')\ndef test_a(): ...\ndef test_b(): ...\n",
    )
    assert _kinds(slow) == {"test_a": INTEGRATION}
    assert _kinds(named) == {"test_a": INTEGRATION, "test_b": UNIT}
    by_marks = classify(named, _fixtures(named), by_fixtures=False)
    assert set(by_marks.values()) == {UNIT}  # --marks-only


def _split(exported: set[str]):
    module = _module("tests/room/test_mixed.py", MIXED)
    place(module, classify(module, _fixtures(module)), exported)
    return module


def test_a_mixed_module_keeps_each_halfs_helpers_and_shares_the_common_ones_once():
    module = _split({"exported_helper"})
    unit, integration = (
        half_text(module, k, "tests.helpers.room.mixed") for k in (UNIT, INTEGRATION)
    )
    shared = shared_text(module, [PurePosixPath("u.py"), PurePosixPath("i.py")])
    names = {
        kind: {n.name for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)}
        for kind, text in (("u", unit), ("i", integration), ("s", shared))
    }
    assert names == {
        "u": {"test_unit_uses_both", "test_unit_alone"},
        "i": {"test_marked_slow", "test_started_on_a_server", "_only_slow"},
        "s": {"_answer", "doubled", "exported_helper"},
    }
    assert "# the figure both halves check\nANSWER = 42" in shared  # comments travel along
    assert "from tests.helpers.room.mixed import ANSWER, _answer\n" in unit
    for half in (unit, integration):  # a fixture bound by name, not imported: see _shared_import
        assert "from tests.helpers.room import mixed as _shared" in half
        assert "\ndoubled = _shared.doubled\n" in half
    assert {c.place for c in module.chunks if c.kind == "helper"} == {SHARED, INTEGRATION}


def test_imports_of_a_moved_module_follow_each_name_and_keep_their_comments():
    source = (
        "from tests.room.test_mixed import a, b as c  # noqa: F401\n"
        "def f():\n    from tests.room.test_whole import x\n    return x\n"
        "import tests.room.test_whole as w\n"
    )
    symbols = {
        "tests.room.test_mixed": {
            "a": "tests.unit.room.test_mixed",
            "b": "tests.helpers.room.mixed",
        },
        "tests.room.test_whole": "tests.integration.room.test_whole",
    }
    assert rewrite_imports(source, symbols) == (
        "from tests.unit.room.test_mixed import a\n"
        "from tests.helpers.room.mixed import b as c  # noqa: F401\n"
        "def f():\n    from tests.integration.room.test_whole import x\n    return x\n"
        "import tests.integration.room.test_whole as w\n"
    )


def test_a_path_climb_from_the_file_reaches_the_same_folder_one_level_deeper():
    source = (
        "A = Path(__file__).resolve().parents[2]\n"
        "B = Path(__file__).parent.parent / 'flows'\n"
        "C = Path(__file__).parent / 'data.json'\n"
    )
    old, new = PurePosixPath("tests/room/test_x.py"), PurePosixPath("tests/unit/room/test_x.py")
    text, warnings = rewrite_file_paths(source, old, new)
    assert text.splitlines()[:2] == [
        "A = Path(__file__).resolve().parents[3]",
        "B = Path(__file__).resolve().parents[2] / 'flows'",
    ]
    assert warnings == [f"{new}:3: Path(__file__) reaches tests/room, not above it"]


def test_a_long_line_a_path_made_is_wrapped_in_a_comment_or_docstring_and_named_in_code():
    word = "tests/integration/room/test_x.py"
    source = (
        f'"""Doc\n{"w " * 40}{word}."""\n# {"c " * 40}{word}\n'
        f"N = 1  # {'t ' * 40}{word}\n"
        f'X = "{"v" * 80}{word}"\n'
    )
    text, long = split_docs.rewrap(source, set())
    lines = text.splitlines()
    assert all(len(line) <= 100 for line in lines[:-1])
    assert lines[3].startswith("# ") and lines[-3:-1] == [f"# {word}", "N = 1"]
    assert long == [len(lines)]


def test_an_edited_paragraph_of_a_page_is_filled_again_and_a_list_is_not():
    page = (
        "Intro.\n\nThe fast tier: `pytest tests/unit` runs\nthe unit tests "
        + "x " * 60
        + "\n\n- a\n- b\n"
    )
    filled = split_docs.reflow(page, split_docs._pattern("`pytest tests/unit` runs"))
    para = filled.split("\n\n")[1]
    assert all(len(line) <= 100 for line in para.splitlines()) and len(para.splitlines()) == 2
    assert filled.startswith("Intro.\n\nThe fast tier:") and filled.endswith("\n\n- a\n- b\n")


def test_every_edit_of_the_fast_tiers_command_finds_its_text_in_this_repository():
    """Before the split the old text is there, after it the new one: a page reworded since
    would leave its edit undone (the script warns; this fails first)."""
    root = Path(__file__).resolve().parents[2]
    for name, old, new in split_docs.EDITS:
        text = (root / name).read_text()
        assert split_docs._pattern(old).search(text) or split_docs._pattern(new).search(text), name


def _repo(root: Path) -> None:
    files = {
        "README.md": "`tests/room/test_mixed.py::test_marked_slow`, tests/room/test_whole.py.\n",
        "pyproject.toml": "[tool.pytest.ini_options]\nmarkers = ['slow: slow']\n",
        "tests/__init__.py": "",
        "tests/conftest.py": CONFTEST,
        "tests/room/__init__.py": "",
        "tests/room/test_mixed.py": MIXED,
        "tests/room/test_whole.py": CLIMB,
        "tests/other/__init__.py": "",
        "tests/other/test_importer.py": IMPORTER,
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "tests"]):
        subprocess.run(["git", *args], cwd=root, check=True, env=_git_env())


def _git_env() -> dict[str, str]:
    return {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }


def _collected(root: Path, *args: str) -> list[str]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-n",
            "0",
            "--collect-only",
            "-p",
            "no:cacheprovider",
            *args,
        ],
        cwd=root,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    return sorted(line for line in out.stdout.splitlines() if "::" in line)


@pytest.mark.slow
def test_the_split_keeps_every_test_and_history_and_a_second_run_changes_nothing(tmp_path):
    _repo(tmp_path)
    before = _collected(tmp_path)
    assert split_tests.main(["--apply", "--root", str(tmp_path)]) == 0
    after = _collected(tmp_path)
    assert sorted(p.replace("/unit/", "/").replace("/integration/", "/") for p in after) == before
    assert all("/integration/" in n for n in _collected(tmp_path, "tests", "-m", "slow"))
    assert _collected(tmp_path, "tests/unit") == _collected(tmp_path, "-m", "not slow")
    status = subprocess.run(
        ["git", "status", "--short"], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout
    assert "R  tests/room/test_whole.py -> tests/unit/room/test_whole.py" in status
    readme = (tmp_path / "README.md").read_text()
    assert "tests/integration/room/test_mixed.py::test_marked_slow" in readme
    assert "tests/unit/room/test_whole.py." in readme
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert run.returncode == 0, run.stdout[-2000:]
    subprocess.run(["git", "commit", "-qam", "split"], cwd=tmp_path, check=True, env=_git_env())
    assert split_tests.main(["--apply", "--root", str(tmp_path)]) == 0
    assert (
        subprocess.run(
            ["git", "status", "--porcelain"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        == ""
    )
