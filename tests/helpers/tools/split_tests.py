"""Helpers both halves of test_split_tests.py use: tests/unit/tools/test_split_tests.py and
tests/integration/tools/test_split_tests.py (and any other test module that imports them)."""

from __future__ import annotations

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
