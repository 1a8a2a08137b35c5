"""No credential reaches MLflow, Prefect or the run's files: a job runs with recognisable fake
AWS credentials and every record it produced is scanned for them. `hetflow demo` given such
credentials and nothing else stays on a local S3 endpoint (the session's `demo` fixture)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.fake_credentials import SECRETS, leaks

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


async def _prefect_records(flow_run_id) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    async with get_client() as client:
        run = await client.read_flow_run(flow_run_id)
        logs = await client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
        artifacts = await client.read_artifacts()
    return "\n".join(
        [
            repr(run.parameters),
            repr(run.state),
            *(log.message for log in logs),
            *(repr(a.data) for a in artifacts),
        ]
    )


def test_fake_credentials_appear_in_no_record(
    s3, monkeypatch, tmp_path, hetflow_home, prefect_harness
):
    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)
    from hetflow.config import ClusterSpec, DatasetSpec, TrackingConfig, TrainConfig
    from hetflow.flows.train import train

    state = train(
        cluster=ClusterSpec.from_speeds([1, 2], time_scale=2.0),
        dataset=DatasetSpec(url="s3://hetflow-secrets/digits", cache_dir=str(tmp_path / "cache")),
        train=TrainConfig.variant(
            "optimized", recipe="digits-mlp", steps=12, global_batch=32, eval_every=4
        ),
        tracking=TrackingConfig(experiment="secrets"),
        return_state=True,
    )
    assert state.is_completed()
    out = state.result()

    # MLflow: params, tags, metric names, every artifact's bytes
    client = MlflowClient(f"sqlite:///{hetflow_home}/mlflow.db")
    run = client.get_run(out["run_id"])
    assert not leaks(repr(run.data.params) + repr(run.data.tags) + repr(list(run.data.metrics)))
    local = Path(client.download_artifacts(out["run_id"], "", str(tmp_path / "artifacts")))
    files = [p for p in local.rglob("*") if p.is_file()]
    assert files, "no artifacts to scan"
    for p in files:
        assert not leaks(p.read_bytes().decode("latin-1")), p

    # Prefect: the flow run's parameters, state, logs and artifacts
    assert not leaks(asyncio.run(_prefect_records(state.state_details.flow_run_id)))

    # hetflow's own files: job files, worker logs, results, checkpoints
    scanned = 0
    for p in hetflow_home.rglob("*"):
        if p.is_file():  # the MLflow SQLite file included
            assert not leaks(p.read_bytes().decode("latin-1")), p
            scanned += 1
    assert scanned > 5


@pytest.mark.timeout(420)
def test_demo_with_aws_credentials_runs_locally_and_records_none(demo):
    """The session's `hetflow demo` had fake AWS credentials and nothing else configured: it
    said it used a local endpoint, and no file it left (MLflow's SQLite store and artifacts,
    Prefect's database with the flow runs' parameters, logs and artifacts, the run directories,
    its own output) holds a credential."""
    home, _, _ = demo
    said = (home / "demo.out").read_text()  # the flow's prints come through Prefect's logger
    assert "S3: a local endpoint at http://127.0.0.1:" in said and "amazonaws.com" not in said
    files = [p for p in home.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"mlflow.db", "demo.out", "result.json", "job.json"} <= names, names
    assert any(p.suffix == ".db" and "prefect" in str(p.parent) for p in files), names
    for p in files:
        assert not leaks(p.read_bytes().decode("latin-1")), p
