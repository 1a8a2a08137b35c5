"""The train flow trains with the TrainConfig it is given (the Prefect form's "Batch schedule"
and "Gradient communication" included); `hetflow train --variant` applies the preset first."""

from __future__ import annotations

import pytest

from hetflow.config import ClusterSpec, DatasetSpec, TrackingConfig, TrainConfig


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_schedule_and_compression_from_the_train_parameter_are_what_runs(
    s3, prefect_harness, tmp_path
):
    from mlflow.tracking import MlflowClient

    from hetflow.flows.train import train
    from hetflow.infra.tracking.tracker import MLflowTracker

    cfg = TrainConfig(
        recipe="digits-mlp",
        steps=4,
        global_batch=32,
        eval_every=2,
        schedule="equal",
        compression="fp16",
    )
    out = train(
        cluster=ClusterSpec.from_speeds([1, 4], time_scale=2.0),
        dataset=DatasetSpec(
            url="s3://hetflow-train-form/digits", cache_dir=str(tmp_path / "cache")
        ),
        train=cfg,
        tracking=TrackingConfig(),
    )
    # speeds 1 and 4: any schedule but 'equal' would give rank 1 the larger share
    assert out["metrics"]["rank0/local_batch"] == out["metrics"]["rank1/local_batch"] == 16

    run = MlflowClient(MLflowTracker(TrackingConfig()).tracking_uri).get_run(out["run_id"])
    params, tags = run.data.params, run.data.tags
    assert params["train.schedule"] == "equal" and params["train.compression"] == "fp16"
    assert params["plan.local_batches"] == "[16, 16]"
    assert params["plan.compression.name"] == "fp16"
    assert tags["compression_reason"] == "set in the train config"
    assert tags["variant"] == "equal+fp16" and run.info.run_name == "equal+fp16"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_declared_cap_above_the_measured_one_fails_the_train_task_once_in_one_line(
    digits, prefect_harness, hetflow_home, monkeypatch
):
    from prefect import flow

    import hetflow.tasks.train as train_task
    from hetflow.cli import one_line
    from hetflow.config import ConfigError
    from hetflow.infra.paths import runs_dir

    from tests.profiles import profile_of, rank_profile

    plans = []

    def counted_make_plan(*args):
        plans.append(args)
        return make_plan(*args)

    make_plan = train_task.make_plan
    monkeypatch.setattr(train_task, "make_plan", counted_make_plan)
    cluster = ClusterSpec.from_speeds([1, 1])
    cluster.workers[1].memory_cap_batch = 5000
    profile = profile_of([rank_profile(0, 100.0), rank_profile(1, 100.0, memory_cap_batch=1800)])

    @flow
    def one_variant():
        train = TrainConfig(recipe="digits-mlp", global_batch=32, steps=2)
        return train_task.train_variant(
            "optimized", cluster, digits, train, profile, TrackingConfig()
        )

    with pytest.raises(ConfigError) as e:
        one_variant()
    assert one_line(e.value) == (  # what the CLI prints, as its one line
        "cluster.workers[w1].memory_cap_batch: 5000 is more than the 1800 samples w1's device "
        "holds (measured by the profile)"
    )
    assert len(plans) == 1  # bad input is not retried
    assert not list(runs_dir().glob("*optimized*"))  # refused before launch
