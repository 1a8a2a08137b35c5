"""Helpers both halves of test_resolved_job.py use: tests/unit/training/test_resolved_job.py and
tests/integration/training/test_resolved_job.py (and any other test module that imports them)."""

from __future__ import annotations

import sys
from collections import Counter


def _count(monkeypatch, names) -> Counter:
    """Calls of each function `names` names, wherever hetflow's modules hold it."""
    seen: Counter = Counter()
    for name in names:
        holders = [
            m for n, m in list(sys.modules.items()) if n.startswith("hetflow") and hasattr(m, name)
        ]
        real = getattr(holders[0], name)

        def wrapper(*args, _real=real, _name=name, **kwargs):
            seen[_name] += 1
            return _real(*args, **kwargs)

        for module in holders:
            if getattr(module, name) is real:
                monkeypatch.setattr(module, name, wrapper)
    return seen
