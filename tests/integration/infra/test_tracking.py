"""The MLflow tracker as a user sees its output: a logged model that takes any batch, each
"View run" line printed once, and a run id the store does not hold named in one line."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest
import torch

from hetflow.config import TrackingConfig
from hetflow.infra.s3 import free_port
from hetflow.infra.tracking.tracker import MLflowTracker, RunNotFound
from hetflow.training.recipes import DataInfo, get_recipe, seeded_model
from hetflow.training.recipes.export import input_example


def _logged_run(tracker: MLflowTracker) -> str:
    """A new run holding an MLP logged as the training task logs it, then finished; its id."""
    run_id = tracker.client.create_run(tracker.experiment_id()).info.run_id
    recipe = get_recipe("digits-mlp")
    model = seeded_model(recipe, DataInfo(), 0).eval()
    tracker.log_model(run_id, model, input_example(recipe, DataInfo()))
    tracker.finish(run_id)
    return run_id


def _logged_model_uri(tracker: MLflowTracker, run_id: str) -> str:
    """The `models:/` URI of the one model the run logged."""
    (logged,) = tracker.client.search_logged_models(
        [tracker.experiment_id()], filter_string=f"source_run_id = '{run_id}'"
    )
    return f"models:/{logged.model_id}"


@pytest.mark.slow
def test_the_logged_model_takes_any_batch_size_without_a_warning(caplog):
    import mlflow.pytorch

    tracker = MLflowTracker(TrackingConfig())  # SQLite under the test's HETFLOW_HOME
    with caplog.at_level(logging.WARNING):
        run_id = _logged_run(tracker)
    assert not [r for r in caplog.records if "specialized" in r.getMessage()]
    model = mlflow.pytorch.load_model(_logged_model_uri(tracker, run_id))
    for batch in (1, 5):
        assert model(torch.zeros(batch, 64)).shape == (batch, 10)


@pytest.mark.slow
def test_the_model_logged_on_a_gpu_host_validates_its_input_on_the_cpu(caplog, monkeypatch):
    """MLflow's pyfunc loader picks the GPU where CUDA is available, and a model exported on
    the CPU cannot move there: on an H100 host the input example's check failed. The host's
    GPU is what is stood in for here (`torch.cuda.is_available`), nothing of MLflow."""
    import mlflow.pyfunc
    import mlflow.pytorch
    from mlflow.exceptions import MlflowException

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    tracker = MLflowTracker(TrackingConfig())
    with caplog.at_level(logging.WARNING):
        run_id = _logged_run(tracker)
    assert not [r for r in caplog.records if "validate serving input" in r.getMessage()]
    uri = _logged_model_uri(tracker, run_id)
    with pytest.raises(MlflowException, match="can't be loaded on 'cuda'"):
        mlflow.pyfunc.load_model(uri)  # MLflow's default on a GPU host: why the docstring says
    model = mlflow.pyfunc.load_model(uri, model_config={"device": "cpu"})
    assert model.predict(torch.zeros(3, 64).numpy()).shape == (3, 10)
    assert mlflow.pytorch.load_model(uri)(torch.zeros(2, 64)).shape == (2, 10)  # loads as is


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """An MLflow server on 127.0.0.1 (SQLite store, local artifacts); yields its URL."""
    d = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    log = (d / "server.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--backend-store-uri",
            f"sqlite:///{d / 'mlflow.db'}",
            "--artifacts-destination",
            (d / "artifacts").as_uri(),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its workers in its own process group, stopped with it
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2)
                break
            except OSError:
                assert proc.poll() is None, (d / "server.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "the MLflow server did not answer"
                time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.mark.slow
def test_a_run_on_a_server_prints_its_view_lines_once(mlflow_server, capfd):
    tracker = MLflowTracker(TrackingConfig(tracking_uri=mlflow_server))
    capfd.readouterr()
    run_id = _logged_run(tracker)
    out = capfd.readouterr().out
    assert out.count(f"View run {tracker.client.get_run(run_id).info.run_name} at:") == 1, out
    assert out.count("View experiment at:") == 1, out


@pytest.mark.slow
def test_a_run_the_server_does_not_hold_is_named(mlflow_server):
    tracker = MLflowTracker(TrackingConfig(tracking_uri=mlflow_server))
    for run_id in (uuid.uuid4().hex, "abc"):
        with pytest.raises(RunNotFound) as e:
            tracker.read_metrics(run_id)
        assert str(e.value) == f"no run {run_id!r} in MLflow at {mlflow_server}"
