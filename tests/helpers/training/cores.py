"""Helpers both halves of test_cores.py use: tests/unit/training/test_cores.py and
tests/integration/training/test_cores.py (and any other test module that imports them)."""

from __future__ import annotations

from hetflow.config import ClusterSpec, WorkerSpec


def _cluster(*cpus: int | None, **fields) -> ClusterSpec:
    workers = [WorkerSpec(name=f"w{i}", cpus=c) for i, c in enumerate(cpus)]
    return ClusterSpec(workers=workers, **fields)
