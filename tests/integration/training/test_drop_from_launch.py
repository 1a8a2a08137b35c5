"""Workers a plan leaves at batch 0 and that would only add to every all-reduce are not launched
(`planner.drop_from_launch`, `planner.launched`): a static plan's always, a dynamic plan's
where the all-reduce share they cost is more than 1% of the step (`IDLE_RANK_BUDGET`)."""

from __future__ import annotations

import pytest

from hetflow.config import ClusterSpec, TrackingConfig, TrainConfig

from tests.helpers.training.drop_from_launch import _profile


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_static_plan_launches_without_the_worker_it_leaves_out(
    digits, prefect_harness, hetflow_home
):
    from mlflow.tracking import MlflowClient
    from prefect import flow

    import hetflow.tasks.train as train_task
    from hetflow.infra.tracking.tracker import MLflowTracker

    cluster = ClusterSpec.from_speeds([1, 1, 0.1], time_scale=2.0)
    train = TrainConfig(
        recipe="digits-mlp", global_batch=48, steps=3, schedule="proportional", eval_every=100
    )

    @flow
    def one_variant():
        return train_task.train_variant(
            "static", cluster, digits, train, _profile(0.001), TrackingConfig()
        )

    out = one_variant()
    assert out.plan.dropped == ["w2"] and out.plan.local_batches[2] == 0
    ranks = out.result.ranks
    assert len(ranks) == 2  # w2 was not started: two ranks ran every step
    assert all(len(r.records) == train.steps for r in ranks)
    assert all(sum(r.records[i].batch for r in ranks) == 48 for i in range(train.steps))
    run = MlflowClient(MLflowTracker(TrackingConfig()).tracking_uri).get_run(out.run_id)
    assert run.data.params["plan.dropped"] == '["w2"]'
    assert run.data.params["plan.local_batches"] == str(out.plan.local_batches)
    # the optimizer that ran, resolved from the recipe's own (the config left it to the recipe)
    assert (run.data.params["train.optimizer"], run.data.params["train.lr"]) == ("sgd", "0.05")
    # and the lr it trained at: the recipe's 0.05 at 128, square root, at this run's batch of 48
    assert float(run.data.params["lr_scaled"]) == pytest.approx(0.05 * (48 / 128) ** 0.5)
    assert (run.data.params["lr_scaling"], run.data.params["lr_tuned_batch"]) == ("sqrt", "128")
