"""The `recommend` flow: the command's choice, recorded in a Prefect artifact and an MLflow run
(metrics, table, plot), its bad input failing the flow in the command's one line, and its
deployment in prefect.yaml."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from hetflow.config import (
    RecommendJob,
    RecommendMarket,
    RecommendObjective,
    RentableType,
    SpotOverride,
)

from tests.helpers.flows.recommend_flow import cli

REPO = Path(__file__).resolve().parents[3]


# The same question asked as flags and as the flow's typed parameters (what its form sends).
SAME = [
    (
        [
            *("--candidates", "g4dn.xlarge:2,p3.2xlarge:1", "--global-batch", "640"),
            *("--steps", "1000", "--budget", "20"),
        ],
        {
            "job": RecommendJob(global_batch=640, steps=1000),
            "candidates": [
                RentableType(instance_type="g4dn.xlarge", count=2),
                RentableType(instance_type="p3.2xlarge", count=1),
            ],
            "objective": RecommendObjective(kind="budget", budget_usd=20),
        },
    ),
    (
        [
            *("--candidates", "g4dn.xlarge:4,p3.2xlarge:2", "--global-batch", "512"),
            *("--steps", "5000", "--deadline-h", "3", "--deadline-margin", "0.2"),
            *("--market", "both", "--interruptions", "p3.2xlarge:40"),
            *("--spot-discount", "g4dn.xlarge:0.5", "--restart-s", "120"),
            *("--max-local-batch", "128"),
        ],
        {
            "job": RecommendJob(global_batch=512, steps=5000, max_local_batch=128),
            "candidates": [
                RentableType(instance_type="g4dn.xlarge", count=4),
                RentableType(instance_type="p3.2xlarge", count=2),
            ],
            "objective": RecommendObjective(kind="deadline", deadline_h=3, deadline_margin=0.2),
            "market": RecommendMarket(
                kind="both",
                restart_s=120,
                overrides=[
                    SpotOverride(instance_type="p3.2xlarge", interruptions_per_month=40),
                    SpotOverride(instance_type="g4dn.xlarge", discount=0.5),
                ],
            ),
        },
    ),
]


@pytest.mark.parametrize("flags, params", SAME, ids=["budget", "deadline-spot"])
def test_the_command_and_the_flow_give_the_same_answer(flags, params, tmp_path, capsys):
    """The flow's task (`recommend_mix`, what the flow runs) and `hetflow recommend` choose
    alike and write the same cluster file, Ray YAML and figures (the search's own time aside)."""
    from hetflow.config import RecommendRequest
    from hetflow.tasks.recommend import recommend_mix

    code, want, cluster_text, err = cli(flags, tmp_path, capsys)
    assert code == 0, err
    out = recommend_mix.fn(RecommendRequest(**params))
    got = out.rec.figures()
    for figures in (want, got):
        figures.pop("time_to_recommend_s")
    assert json.loads(json.dumps(got)) == want
    assert out.rec.cluster_yaml() == cluster_text
    assert out.ray_yaml == (tmp_path / "cli-ray.yaml").read_text()


def test_the_recommend_deployment_resolves_to_the_flow_and_its_forms():
    from prefect.flows import load_flow_from_entrypoint
    from prefect.utilities.callables import parameter_schema

    spec = yaml.safe_load((REPO / "prefect.yaml").read_text())
    (dep,) = [d for d in spec["deployments"] if d["name"] == "recommend"]
    assert dep["work_pool"]["name"] == "hetflow-local" and dep["schedules"] == []
    flow = load_flow_from_entrypoint(str(REPO / dep["entrypoint"]))
    assert flow.name == "recommend"
    schema = parameter_schema(flow.fn).model_dump_for_openapi()
    assert set(schema["properties"]) == {
        *("job", "candidates", "objective", "tracking", "market", "history")
    }
    forms = {"RecommendJob", "RentableType", "RecommendObjective", "TrackingConfig"}
    assert forms | {"RecommendMarket", "SpotOverride"} <= set(schema["definitions"])
    with pytest.raises(ValueError, match="objective 'deadline' needs deadline_h"):
        RecommendObjective(kind="deadline")


def test_the_recommend_run_lands_in_a_model_training_experiment(tmp_path):
    """MLflow 3 opens an experiment by its kind; one made by the recommend run is marked model
    training, as the demo's is (`MLflowTracker.experiment_id`), not left to be read as GenAI."""
    from mlflow.tracking import MlflowClient

    from hetflow.config import RecommendRequest, TrackingConfig, default_rentable
    from hetflow.infra.tracking.tracker import EXPERIMENT_KIND, MODEL_TRAINING
    from hetflow.tasks.recommend import recommend_mix, record_recommendation

    request = RecommendRequest(job=RecommendJob(steps=100), candidates=default_rentable())
    out = recommend_mix.fn(request)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking = TrackingConfig(tracking_uri=uri, experiment="renting")
    run_id = record_recommendation.fn(out, request, tracking)
    client = MlflowClient(uri)
    exp = client.get_experiment(client.get_run(run_id).info.experiment_id)
    assert exp.name == "renting" and exp.tags[EXPERIMENT_KIND] == MODEL_TRAINING
