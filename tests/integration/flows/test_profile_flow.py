"""The profile flow: storage and history in S3, drift flags, MLflow and Prefect artifacts.

The torchrun profile itself is tested in test_probes.py; here `profile_workers` is replaced by
a stand-in that returns measured-looking figures, so that the flow's own work is what runs.
"""

from __future__ import annotations

import json

import pytest

import hetflow.flows.profile_cluster as profile_flow
from hetflow.config import ClusterSpec, ConfigError, DatasetSpec, TrainConfig
from hetflow.infra.catalog import CatalogError
from hetflow.infra.s3 import filesystem
from hetflow.records import Profile

from tests.helpers.flows.profile_flow import speeds
from tests.profiles import profile_of, rank_profile

pytestmark = pytest.mark.timeout(240)


def fake_profile_workers(measured: list[float]):
    """A stand-in for tasks.profile.profile_workers: ranks with the given samples/s."""

    def run(cluster: ClusterSpec, dataset: DatasetSpec, train: TrainConfig, job=None) -> Profile:
        fastest = max(measured)
        ranks = [
            rank_profile(
                i,
                s,
                worker=w.name,
                relative_speed=s / fastest,
                fit_latency_s=0.01,
                grad_allreduce_s=0.01,
                step_compute_s=0.1,
                allreduce_latency_s=0.001,
                allreduce_gbps=5.0,
                link_gbps=0.5 if w.link_gbps else 8.0,
                link_latency_s=0.0002,
                memory_cap_batch=4096,
            )
            for i, (w, s) in enumerate(zip(cluster.workers, measured, strict=True))
        ]
        run.seen = cluster
        return profile_of(ranks, cluster=cluster.name, model=train.recipe, profiling_time_s=9.0)

    return run


def test_profile_flow_resolves_instance_types_stores_history_and_flags_drift(
    s3, prefect_harness, monkeypatch, hetflow_home
):
    dataset = DatasetSpec(url="s3://hetflow-profiles/digits", cache_dir=str(hetflow_home / "cache"))
    cluster = ClusterSpec.model_validate(
        {
            "name": "g4dn-g5",
            "workers": [
                {"name": "t4", "instance_type": "g4dn.xlarge"},
                {"name": "a10g-1", "instance_type": "g5.xlarge"},
                {"name": "a10g-2", "instance_type": "g5.xlarge", "link_gbps": 0.5},
            ],
        }
    )
    train = TrainConfig(global_batch=32)
    prefix = "s3://hetflow-profiles/profiles/g4dn-g5/digits-cnn"
    previous = speeds(
        {"t4": 0.26, "a10g-1": 1.0, "a10g-2": 1.0}, created_at="20240101T000000000000Z"
    )
    fs, root = filesystem(prefix)
    fs.mkdir("hetflow-profiles")
    fs.pipe_file(f"{root}/{previous.created_at}.json", previous.model_dump_json().encode())
    fs.pipe_file(f"{root}/20230101T000000000000Z.json", b'{"not": "a profile"}')  # skipped

    fake = fake_profile_workers([26.0, 100.0, 70.0])  # a10g-2 is 30% slower than last time
    monkeypatch.setattr(profile_flow, "profile_workers", fake)
    out = profile_flow.profile_cluster(cluster=cluster, dataset=dataset, train=train)

    # the emulated cluster was derived from the EC2 catalog before launch
    assert [w.speed for w in fake.seen.workers] == pytest.approx([8.1 / 31.2, 1.0, 1.0], rel=1e-4)
    assert [w.link_gbps for w in fake.seen.workers] == [5.0, 2.5, 0.5]  # a set link stays
    assert out["cost"]["total_usd"] > 0 and set(out["cost"]["by_worker"]) == {
        "t4",
        "a10g-1",
        "a10g-2",
    }
    report = out["report"]
    assert report["workers"][0]["instance_type"] == "g4dn.xlarge"
    assert [w["measured_speed"] for w in report["workers"]] == [0.26, 1.0, 0.7]

    # history: the previous profile was read, the new one stored next to it, drift flagged
    assert out["previous_profiles"] == [previous.created_at]
    assert [d["worker"] for d in out["drift"]] == ["a10g-2"]
    assert out["drift"][0]["change"] == pytest.approx(-0.3)
    assert out["stored_at"].startswith(prefix + "/")
    stored = sorted(fs.ls(root, detail=False))
    assert (
        len(stored) == 3 and json.loads(fs.cat_file(stored[-1]))["drift"][0]["worker"] == "a10g-2"
    )
    assert Profile.model_validate_json(fs.cat_file(stored[-1])).cluster_spec["name"] == "g4dn-g5"

    from mlflow.tracking import MlflowClient

    from hetflow.config import TrackingConfig
    from hetflow.infra.tracking.tracker import MLflowTracker

    client = MlflowClient(MLflowTracker(TrackingConfig()).tracking_uri)
    run = client.get_run(out["mlflow_run_id"])
    assert run.data.tags["variant"] == "profile" and run.data.tags["cluster"] == "g4dn-g5"
    assert run.data.metrics["rank2/relative_speed"] == pytest.approx(0.7)
    assert "profile.json" in [a.path for a in client.list_artifacts(run.info.run_id)]

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    with get_client(sync_client=True) as prefect:  # the newest: other tests' flows make one too
        arts = prefect.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["profile"])),
            sort=ArtifactSort.CREATED_DESC,
        )
    rows = json.loads(arts[0].data) if isinstance(arts[0].data, str) else arts[0].data
    assert [r["drifted"] for r in rows] == [False, False, True]


def test_bad_profile_inputs_are_refused_before_launch(
    s3, prefect_harness, monkeypatch, hetflow_home
):
    launched = []
    monkeypatch.setattr(profile_flow, "profile_workers", lambda *a: launched.append(a))
    unknown = ClusterSpec.model_validate(
        {
            "workers": [
                {"name": "a", "instance_type": "g5.xlarge"},
                {"name": "b", "instance_type": "g5.gigantic"},
            ]
        }
    )
    with pytest.raises(CatalogError, match="g5.gigantic"):
        profile_flow.profile_cluster(
            cluster=unknown, train=TrainConfig(global_batch=32), record=False
        )
    with pytest.raises(ConfigError, match="drift_threshold"):
        profile_flow.profile_cluster(drift_threshold=0, record=False)
    assert launched == []


def test_hetflow_profile_prints_measured_next_to_emulated_and_writes_the_issue_json(
    s3, prefect_harness, monkeypatch, hetflow_home, tmp_path, capsys
):
    from hetflow.cli import main

    monkeypatch.setattr(profile_flow, "profile_workers", fake_profile_workers([26.0, 100.0]))
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps the headers on a narrower terminal
    path = tmp_path / "profile.json"
    assert main(["profile", "--speeds", "1,4", "--json", str(path)]) == 0
    out = json.loads(path.read_text())
    assert out["profiling_time_s"] == 9.0 and len(out["ranks"]) == 2
    assert {
        "cluster",
        "model",
        "created_at",
        "cluster_spec",
        "previous_profiles",
        "drift",
        "stored_at",
        "mlflow_run_id",
    } <= set(out)  # the report at the top, the profile beside
    assert [(w["name"], w["emulated_speed"], w["measured_speed"]) for w in out["workers"]] == [
        ("w0", 0.25, 0.26),
        ("w1", 1.0, 1.0),
    ]
    assert set(out["workers"][0]) >= {
        "link_gbps_emulated",
        "link_gbps_measured",
        "link_latency_ms",
        "memory_cap_batch",
    }
    printed = capsys.readouterr().out
    assert "speed measured" in printed and "+4.0%" in printed and "9.0s" in printed
