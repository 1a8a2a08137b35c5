"""`tools/split_tests.py`: which tests are integration, how a mixed module is cut (each half its
tests and helpers, the helpers both use shared once), and how imports, `Path(__file__)` climbs
and quoted paths follow; the whole run on a small repository, twice."""

from __future__ import annotations

import ast
from pathlib import Path, PurePosixPath

from tools import split_docs
from tools.split_plan import INTEGRATION, SHARED, UNIT, Fixtures, classify, parse_module, place
from tools.split_render import half_text, rewrite_file_paths, rewrite_imports, shared_text

from tests.helpers.tools.split_tests import CONFTEST, MIXED


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
    root = Path(__file__).resolve().parents[3]
    for name, old, new in split_docs.EDITS:
        text = (root / name).read_text()
        assert split_docs._pattern(old).search(text) or split_docs._pattern(new).search(text), name
