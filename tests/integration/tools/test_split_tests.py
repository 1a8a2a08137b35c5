"""`tools/split_tests.py`: which tests are integration, how a mixed module is cut (each half its
tests and helpers, the helpers both use shared once), and how imports, `Path(__file__)` climbs
and quoted paths follow; the whole run on a small repository, twice."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools import split_tests

from tests.helpers.tools.split_tests import CONFTEST, MIXED

IMPORTER = """from tests.room.test_mixed import exported_helper


def test_imports_a_helper_of_a_split_module():
    assert exported_helper() == 1
"""


CLIMB = """from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_finds_the_root():
    assert (ROOT / "README.md").exists()
"""


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
