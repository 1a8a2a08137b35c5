"""A dead endpoint ends a run at once, in one line naming it and what to set, before anything is
written: from the command line (`hetflow demo`, a subprocess, as a user runs it) and inside a
flow (its first task fails; no dataset is written, no worker launched)."""

from __future__ import annotations

import asyncio

import pytest

from hetflow.infra.s3 import free_port

from tests.helpers.infra.preflight import _hetflow

pytestmark = pytest.mark.timeout(120)


def test_an_endpoint_that_answers_without_credentials_is_named(s3_server, tmp_path):
    """An S3 endpoint that answers, and no credential to sign with: s3fs would retry unsigned
    requests for a minute; the check says what to set instead."""
    proc, _ = _hetflow(
        tmp_path / "home", {"AWS_ENDPOINT_URL": s3_server}, "data", "ingest", "--url", "s3://x/y"
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert s3_server in lines[0] and "AWS_ACCESS_KEY_ID" in lines[0]


@pytest.mark.slow
def test_a_flow_with_a_dead_mlflow_fails_at_its_first_task_before_writing(
    s3, prefect_harness, tmp_path, hetflow_home, fault_table
):
    """The compare flow (as a deployment runs it) given a tracking URI nobody serves: the
    flow run fails in its first task with the one line; no dataset, no run directory."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from hetflow.config import ClusterSpec, DatasetSpec, TrackingConfig, TrainConfig
    from hetflow.flows.compare import compare
    from hetflow.infra.s3 import filesystem

    dead = f"http://127.0.0.1:{free_port()}"
    dataset = DatasetSpec(url="s3://hetflow-preflight/digits", cache_dir=str(tmp_path / "c"))
    state = compare(
        cluster=ClusterSpec.from_speeds([1, 2]),
        dataset=dataset,
        train=TrainConfig(recipe="digits-mlp", steps=5, global_batch=32),
        tracking=TrackingConfig(tracking_uri=dead),
        return_state=True,
    )
    assert state.is_failed()
    assert f"MLflow {dead} (tracking.tracking_uri) cannot be reached" in state.message
    assert "\n" not in state.message

    async def task_names() -> list[str]:
        async with get_client() as client:
            runs = await client.read_task_runs(
                flow_run_filter=FlowRunFilter(
                    id=FlowRunFilterId(any_=[state.state_details.flow_run_id])
                )
            )
        return [r.name for r in runs]

    assert asyncio.run(task_names()) == ["check services"]
    fs, root = filesystem(dataset.url)
    assert not fs.exists(f"{root}/manifest.json")
    assert not (hetflow_home / "runs").exists()
    fault_table.append(
        (
            "dead MLflow (tracking.tracking_uri)",
            "compare flow",
            "failed at its first task",
            0,
            "none",
            1,
        )
    )
