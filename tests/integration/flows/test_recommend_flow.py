"""The `recommend` flow: the command's choice, recorded in a Prefect artifact and an MLflow run
(metrics, table, plot), its bad input failing the flow in the command's one line, and its
deployment in prefect.yaml."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetflow.config import (
    ConfigError,
    RecommendJob,
    RecommendMarket,
    RecommendObjective,
    RentableType,
    SpotOverride,
)

from tests.helpers.flows.recommend_flow import cli


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_flow_records_the_commands_choice_and_fails_as_it_does(
    prefect_harness, tmp_path, capsys
):
    from mlflow.tracking import MlflowClient
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from hetflow.config import TrackingConfig
    from hetflow.flows.recommend import recommend
    from hetflow.infra.tracking.tracker import MLflowTracker

    flags = ["--candidates", "g4dn.xlarge:2,p3.2xlarge:1", "--global-batch", "640"]
    code, want, cluster_text, _ = cli(
        [*flags, "--steps", "1000", "--budget", "20"], tmp_path, capsys
    )
    assert code == 0 and want["chosen"]["mix"] == {"g4dn.xlarge": 2, "p3.2xlarge": 1}
    out = recommend(
        job=RecommendJob(global_batch=640, steps=1000),
        candidates=[
            RentableType(instance_type="g4dn.xlarge", count=2),
            RentableType(instance_type="p3.2xlarge", count=1),
        ],
        objective=RecommendObjective(kind="budget", budget_usd=20),
    )
    assert out["mix"] == want["chosen"]["mix"]
    assert out["predicted_hours"] == pytest.approx(want["chosen"]["hours"])
    assert out["predicted_cost_usd"] == pytest.approx(want["chosen"]["cost_usd"])
    assert out["cluster_file"] == cluster_text  # `hetflow demo --cluster` takes it as is
    assert out["ray_config"] == (tmp_path / "cli-ray.yaml").read_text()  # `ray up` takes it

    client = MlflowClient(MLflowTracker(TrackingConfig()).tracking_uri)
    run = client.get_run(out["mlflow_run_id"])
    assert run.data.tags["variant"] == "recommend" and run.info.status == "FINISHED"
    assert run.data.metrics["predicted_hours"] == pytest.approx(want["chosen"]["hours"])
    assert run.data.metrics["predicted_cost_usd"] == pytest.approx(want["chosen"]["cost_usd"])
    assert run.data.params["chosen.mix"] == "g4dn.xlarge x2, p3.2xlarge x1"
    plot = Path(client.download_artifacts(run.info.run_id, "plots/cost_vs_time.png", tmp_path))
    assert plot.read_bytes()[:4] == b"\x89PNG"
    ray_yaml = Path(client.download_artifacts(run.info.run_id, "recommended-ray.yaml", tmp_path))
    assert ray_yaml.read_text() == out["ray_config"]
    table = Path(client.download_artifacts(run.info.run_id, "recommendation.md", tmp_path))
    assert "| g4dn.xlarge x2 + p3.2xlarge x1 | 3 |" in table.read_text()

    with get_client(sync_client=True) as prefect:
        arts = prefect.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["recommendation"]))
        )
    assert arts and arts[0].type == "markdown"
    assert "chosen: g4dn.xlarge x2 + p3.2xlarge x1" in arts[0].data
    assert "why it loses" in arts[0].data and out["mlflow_run_id"] in arts[0].data

    unknown = [RentableType(instance_type="g9.xlarge", count=2)]
    bad = [  # (flags, the flow's arguments): the flow fails with the command's line
        (["--candidates", "g9.xlarge:2"], {"candidates": unknown}),
        (
            ["--deadline-h", "0.001"],
            {"objective": RecommendObjective(kind="deadline", deadline_h=1e-3)},
        ),
        (["--budget", "0.3"], {"objective": RecommendObjective(kind="budget", budget_usd=0.3)}),
    ]
    for flags, kwargs in bad:
        code, _, _, err = cli(flags, tmp_path, capsys)
        assert code == 2
        last = err.strip().splitlines()[-1]  # MLflow may have logged above it
        assert last.startswith("hetflow: error: ")
        line = last.removeprefix("hetflow: error: ")
        with pytest.raises(ConfigError) as raised:
            recommend(**kwargs)
        assert str(raised.value) == line


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_flow_records_the_spot_figures_the_command_prints(prefect_harness, tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    from hetflow.config import TrackingConfig
    from hetflow.flows.recommend import recommend
    from hetflow.infra.tracking.tracker import MLflowTracker

    flags = ["--candidates", "g4dn.xlarge:2,p3.2xlarge:1", "--global-batch", "512"]
    flags += ["--steps", "5000", "--market", "both", "--interruptions", "p3.2xlarge:40"]
    code, want, cluster_text, _ = cli([*flags, "--restart-s", "120"], tmp_path, capsys)
    chosen = want["chosen"]
    assert code == 0 and chosen["market"] == "spot" and chosen["interruptions"] > 0
    candidates = [
        RentableType(instance_type="g4dn.xlarge", count=2),
        RentableType(instance_type="p3.2xlarge", count=1),
    ]
    over = [SpotOverride(instance_type="p3.2xlarge", interruptions_per_month=40)]
    market = RecommendMarket(kind="both", overrides=over, restart_s=120)
    job = RecommendJob(global_batch=512, steps=5000)
    out = recommend(job=job, candidates=candidates, market=market)
    assert out["mix"] == chosen["mix"] and out["cluster_file"] == cluster_text
    assert out["predicted_cost_usd"] == pytest.approx(chosen["cost_usd"])

    run = MlflowClient(MLflowTracker(TrackingConfig()).tracking_uri).get_run(out["mlflow_run_id"])
    metrics, params = run.data.metrics, run.data.params
    assert metrics["predicted_hours"] == pytest.approx(chosen["hours"])
    assert metrics["expected_interruptions"] == pytest.approx(chosen["interruptions"])
    assert metrics["predicted_hours_uninterrupted"] == pytest.approx(chosen["hours_uninterrupted"])
    assert params["market.kind"] == "both" and params["chosen.market"] == "spot"
    assert params["market.restart_s"] == "120.0" and params["market.checkpoint_every"] == "25"
    assert "Spot Instance Advisor" in params["market.spot_table"]

    code, _, _, err = cli(
        ["--market", "spot", "--interruptions", "g4dn.xlarge:-1"], tmp_path, capsys
    )
    assert code == 2 and "--interruptions: Input should be greater than or equal to 0" in err
    with pytest.raises(ValueError, match="interruptions_per_month\n  Input should be greater"):
        SpotOverride(instance_type="g4dn.xlarge", interruptions_per_month=-1)
