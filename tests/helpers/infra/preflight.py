"""Helpers both halves of test_preflight.py use: tests/unit/infra/test_preflight.py and
tests/integration/infra/test_preflight.py (and any other test module that imports them)."""

from __future__ import annotations

import os
import subprocess
import time

from tests.procs import run_cli


def _hetflow(home, extra: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess, float]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "MLFLOW_", "PREFECT_API", "HTTP_PROXY", "HTTPS_PROXY"))
    }
    env.update(HETFLOW_HOME=str(home), PREFECT_HOME=str(home / "prefect"), **extra)
    t = time.perf_counter()
    proc = run_cli(list(args), env, timeout=120)
    return proc, time.perf_counter() - t
