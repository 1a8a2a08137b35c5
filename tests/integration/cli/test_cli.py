"""The command line as a new user meets it: one-line errors, no abbreviations, suggestions for
typos, defaults in the help, and bad input refused before Prefect, MLflow or torch load."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

from tests.procs import run_cli


def _cli(*args: str, home) -> subprocess.CompletedProcess:
    """`python -m hetflow.cli ARGS` with its own HETFLOW_HOME, as a user runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PREFECT_API"))}
    env["HETFLOW_HOME"] = str(home)
    return run_cli(list(args), env, timeout=120)


# -- unknown run ids ----------------------------------------------------------------------------


@pytest.fixture
def recorded_run(hetflow_home) -> str:
    """A run with one metric in the default store (SQLite under HETFLOW_HOME); its id."""
    from hetflow.config import TrackingConfig
    from hetflow.infra.tracking.tracker import MLflowTracker

    tracker = MLflowTracker(TrackingConfig())
    run_id = tracker.client.create_run(tracker.experiment_id()).info.run_id
    tracker.log_metrics(run_id, {"throughput_samples_per_s": 100.0})
    tracker.finish(run_id)
    return run_id


@pytest.mark.slow
def test_compare_names_the_run_id_the_store_does_not_hold(recorded_run, hetflow_home):
    unknown = uuid.uuid4().hex
    proc = _cli("compare", recorded_run, unknown, home=hetflow_home)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"hetflow: error: compare: no run {unknown!r} in MLflow at "
        f"sqlite:///{hetflow_home / 'mlflow.db'}"
    ]
    both = _cli("compare", "abc", "def", home=hetflow_home)
    assert both.returncode == 2 and len(both.stderr.splitlines()) == 1
    assert "'abc' and 'def'" in both.stderr
    ok = _cli("compare", recorded_run, recorded_run, home=hetflow_home)
    assert ok.returncode == 0, ok.stderr
    assert "throughput_samples_per_s" in ok.stdout
