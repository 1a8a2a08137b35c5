"""Helpers both halves of test_cpu_quota.py use: tests/unit/training/test_cpu_quota.py and
tests/integration/training/test_cpu_quota.py (and any other test module that imports them)."""

from __future__ import annotations

import os

import pytest

from hetflow.config import ClusterSpec, WorkerSpec
from hetflow.training.cpu_quota import (
    find_controller,
)

CONTROLLER = find_controller()


needs_quotas = pytest.mark.skipif(
    CONTROLLER is None or not os.access(CONTROLLER.root, os.W_OK),
    reason="no writable cgroup CPU controller on this host (needs root and cgroup v1/v2 'cpu')",
)


def _cluster(*quotas: float | None, **fields) -> ClusterSpec:
    workers = [WorkerSpec(name=f"w{i}", cpu_quota=q) for i, q in enumerate(quotas)]
    return ClusterSpec(workers=workers, emulate=False, **fields)
