"""Every test under tests/integration is marked `slow`, whatever its own
marks: the folder is the tier, so `pytest -m "not slow"` and `pytest tests/unit` select the
same tests."""

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items):
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.slow)
