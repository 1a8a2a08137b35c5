"""The tracker against a real MLflow store (SQLite in the test's home): the experiment's kind,
and a comparison's parent run (params, headline metrics, description, plots)."""

from __future__ import annotations

import pytest

from hetflow.config import ClusterSpec, DatasetSpec, TrackingConfig, TrainConfig
from hetflow.infra.tracking.content import finish_comparison
from hetflow.infra.tracking.tracker import EXPERIMENT_KIND, MODEL_TRAINING, NOTE, MLflowTracker
from hetflow.records import Plan, RankResult, RunResult, StepRecord, TrainOutcome
from hetflow.training.metrics import step_series, summarize


@pytest.fixture
def tracker(tmp_path):
    return MLflowTracker(TrackingConfig(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db"))


def outcome(variant: str, run_id: str, batches: list[int], step_s: float) -> TrainOutcome:
    """Five steps of a run whose ranks compute in proportion to their batch and idle the rest."""
    ranks = []
    for r, batch in enumerate(batches):
        compute = step_s * 0.8 * batch / max(batches)
        records = [
            StepRecord(
                step=i,
                batch=batch,
                data_s=0.001,
                compute_s=compute,
                wait_s=step_s - compute - 0.001,
                step_s=step_s,
                loss_sum=2.0 * batch / (i + 1),
                bytes_sent=1e6,
                idle_s=step_s * 0.8 - compute,
                comm_s=step_s * 0.2 - 0.001,
            )
            for i in range(5)
        ]
        ranks.append(RankResult(rank=r, records=records, plans=[]))
    result = RunResult(ranks=ranks)
    return TrainOutcome(
        variant=variant,
        run_id=run_id,
        run_dir="unused",
        plan=Plan.equal(batches),
        metrics=summarize(result, sum(batches), None),
        series=step_series(result, sum(batches)),
        result=result,
    )


def test_the_experiment_is_created_as_model_training(tracker):
    exp = tracker.client.get_experiment(tracker.experiment_id())
    assert exp.tags[EXPERIMENT_KIND] == MODEL_TRAINING == "custom_model_development"


def test_an_unmarked_experiment_is_marked_and_a_chosen_kind_is_kept(tracker):
    old = tracker.client.create_experiment("hetflow")  # as hetflow made it before
    assert tracker.experiment_id() == old
    assert tracker.client.get_experiment(old).tags[EXPERIMENT_KIND] == MODEL_TRAINING
    other = MLflowTracker(TrackingConfig(tracking_uri=tracker.tracking_uri, experiment="mine"))
    mine = other.client.create_experiment("mine", tags={EXPERIMENT_KIND: "genai_development"})
    assert other.experiment_id() == mine
    assert other.client.get_experiment(mine).tags[EXPERIMENT_KIND] == "genai_development"


def test_the_parent_run_holds_the_job_the_headline_figures_the_table_and_the_plots(tracker):
    cluster, dataset = ClusterSpec.from_speeds([1, 3], name="mix"), DatasetSpec()
    configs = {
        v: TrainConfig.variant(v, steps=5, global_batch=64) for v in ("baseline", "optimized")
    }
    parent = tracker.start_comparison(cluster, dataset, configs)
    children = {v: tracker.start_run(v, cluster, dataset, parent) for v in configs}
    outcomes = {
        "baseline": outcome("baseline", children["baseline"], [32, 32], 0.2),
        "optimized": outcome("optimized", children["optimized"], [16, 48], 0.1),
    }
    finish_comparison(
        tracker, parent, outcomes, {"baseline": {}, "optimized": {}}, "| md |", ["a", "b"]
    )

    run = tracker.client.get_run(parent)
    m, p = run.data.metrics, run.data.params
    assert m["speedup"] == pytest.approx(2.0)
    assert m["baseline/throughput_samples_per_s"] == pytest.approx(
        outcomes["baseline"].metrics.throughput_samples_per_s
    )
    for name in ("train_loop_s", "comm_bytes_total", "straggler_idle_fraction", "busy_fraction"):
        assert f"baseline/{name}" in m and f"optimized/{name}" in m, name
    assert m["comm_bytes_ratio"] == pytest.approx(1.0)
    assert p["cluster"] == "mix" and p["workers"] == "w0 · 1x, w1 · 3x" and p["world_size"] == "2"
    assert (p["recipe"], p["steps"], p["global_batch"]) == ("digits-cnn", "5", "64")
    assert run.data.tags["recipe"] == "digits-cnn"
    assert (p["baseline.schedule"], p["optimized.schedule"]) == ("equal", "dynamic")
    assert (p["baseline.compression"], p["optimized.compression"]) == ("none", "auto")
    assert run.data.tags[NOTE] == "| md |" and run.info.status == "FINISHED"
    files = {a.path: a.file_size for a in tracker.client.list_artifacts(parent, "plots")}
    assert set(files) == {"plots/side_by_side.png", "plots/busy_fraction.png", "plots/rate.png"}
    assert min(files.values()) > 1000
    top = {a.path for a in tracker.client.list_artifacts(parent)}
    assert {"comparison.json", "comparison.md"} <= top


def test_run_url_names_the_experiment_and_the_model_training_view(tracker):
    url = tracker.run_url("abc")
    assert url == (
        f"http://127.0.0.1:5000/#/experiments/{tracker.experiment_id()}/runs/abc"
        "?workflowType=machine_learning"
    )


def test_a_variant_run_records_the_workers_the_plan_leaves_out_and_why(tracker, tmp_path):
    why = "w2: its fixed cost of 0.5 s per step is at least the 0.04 s step the others take"
    plan = Plan.equal([24, 24, 0]).model_copy(update={"excluded": [why]})
    cluster = ClusterSpec.from_speeds([1, 1, 1])
    dataset = DatasetSpec(url="s3://bucket/digits")
    rid = tracker.open_variant_run(
        "optimized", cluster, dataset, TrainConfig(recipe="digits-mlp"), plan, tmp_path
    )
    params = tracker.client.get_run(rid).data.params
    assert params["plan.excluded"] == f'["{why}"]' and params["plan.local_batches"] == "[24, 24, 0]"
    # and the run's figures have a rank that computed nothing: no division by its zero
    figures = {r.rank: r for r in outcome("optimized", rid, [24, 24, 0], 0.1).metrics.ranks}
    assert figures[2].samples_per_s == 0.0 and figures[2].local_batch == 0
    assert figures[0].samples_per_s > 0


def test_a_variant_run_records_the_learning_rate_rule_it_trains_by(tracker, tmp_path):
    from hetflow.training.loop.optim import resolve_optimizer
    from hetflow.training.recipes import get_recipe

    train = resolve_optimizer(TrainConfig(recipe="gpt", global_batch=512), get_recipe("gpt"))
    cluster, dataset = ClusterSpec.from_speeds([1, 1]), DatasetSpec(url="s3://bucket/text")
    rid = tracker.open_variant_run(
        "optimized", cluster, dataset, train, Plan.equal([256, 256]), tmp_path
    )
    params = tracker.client.get_run(rid).data.params
    got = {k: params[k] for k in params if k.startswith("lr_")}
    want = {"lr_base": 1e-3, "lr_tuned_batch": 128, "lr_scaled": 2e-3, "lr_warmup_steps": 100}
    assert {k: float(got[k]) for k in want} == pytest.approx(want)
    assert got["lr_scaling"] == "sqrt" and len(got) == 5


def test_a_variant_run_that_chose_its_compression_by_trials_holds_the_table_and_the_choice(
    tracker, tmp_path
):
    import json

    from hetflow.infra.tracking.content import record_training
    from hetflow.records import CompressionMethod, CompressionTrials, MethodTrial, Profile

    m = CompressionMethod.parse
    trials = CompressionTrials(
        trials=[
            MethodTrial(method=m("none"), step_s=0.4, bytes_per_step=8.0),
            MethodTrial(method=m("fp16"), step_s=0.3, bytes_per_step=4.0),
            MethodTrial(method=m("powersgd:4"), error="RuntimeError: boom"),
        ],
        steps=4,
        chosen=m("fp16"),
        reason="shortest measured step",
    )
    cluster = ClusterSpec.from_speeds([1, 1])
    rid = tracker.start_run("optimized", cluster, DatasetSpec(url="s3://bucket/digits"))
    done = outcome("optimized", rid, [16, 16], 0.1)
    done.result.ranks[0].trials = trials
    profile = Profile(cluster="local", model="digits-mlp", ranks=[])
    record_training(tracker, done, profile, cluster)
    run = tracker.client.get_run(rid).data
    assert run.params["compression.chosen"] == "fp16"
    assert run.params["compression.chosen_reason"] == "shortest measured step"
    assert run.tags["compression_reason"] == "shortest measured step"
    path = tracker.client.download_artifacts(rid, "compression_trials.json", str(tmp_path))
    table = json.loads(open(path).read())
    rows = [dict(zip(table["columns"], row)) for row in table["data"]]
    assert [r["method"] for r in rows] == ["none", "fp16", "powersgd:4"]
    assert [r["chosen"] for r in rows] == [False, True, False]
    assert rows[1]["step_ms"] == pytest.approx(300.0) and rows[2]["error"] == "RuntimeError: boom"


def test_a_variant_run_records_the_workers_it_went_on_without_and_why(tracker):
    from hetflow.infra.tracking.content import record_training
    from hetflow.records import Profile, Recovery

    cluster = ClusterSpec.from_speeds([1, 1])
    rid = tracker.start_run("optimized", cluster, DatasetSpec(url="s3://bucket/digits"))
    done = outcome("optimized", rid, [24, 24], 0.1)
    why = "no alive node of g4dn.xlarge has room for it: its node was lost, no replacement came"
    done.result.ranks[0].recovery = Recovery(restarts=1, steps_redone=2, left_out={"t4": why})
    done.metrics = summarize(done.result, 48)
    record_training(tracker, done, Profile(cluster="local", model="digits-mlp", ranks=[]), cluster)
    run = tracker.client.get_run(rid).data
    assert run.params["recovery.left_out"] == f'{{"t4": "{why}"}}'
    assert run.metrics["workers_left_out"] == 1 and run.metrics["restarts"] == 1


def test_a_variant_run_records_each_regroup_in_place_as_an_event(tracker, tmp_path):
    import json

    from hetflow.infra.tracking.content import record_training
    from hetflow.records import MembershipChange, Profile, Recovery

    cluster = ClusterSpec.from_speeds([1, 1, 2])
    rid = tracker.start_run("optimized", cluster, DatasetSpec(url="s3://bucket/digits"))
    done = outcome("optimized", rid, [16, 16, 16], 0.1)
    change = MembershipChange(
        step=3,
        lost=[1],
        world=2,
        step_in_flight="retried",
        regroup_s=0.05,
        plan=[24, 0, 24],
        workers={0: "w0", 2: "w2"},
    )
    done.result.ranks[0].recovery = Recovery(membership=[change])
    done.metrics = summarize(done.result, 48)
    record_training(tracker, done, Profile(cluster="local", model="digits-mlp", ranks=[]), cluster)
    run = tracker.client.get_run(rid).data
    assert run.metrics["workers_lost_in_place"] == 1 and run.metrics["steps_retried"] == 1
    history = tracker.client.get_metric_history(rid, "membership.world")
    assert [(m.step, m.value) for m in history] == [(3, 2.0)]
    path = tracker.client.download_artifacts(rid, "membership.json", str(tmp_path))
    saved = json.loads(open(path).read())[0]
    assert saved["lost"] == [1] and saved["workers"] == {"0": "w0", "2": "w2"}


def test_the_per_rank_timeline_labels_each_row_by_the_worker_that_rank_was(tracker, monkeypatch):
    """After a leave in place (rank 1 of w0..w2 left, its result kept) and a join of a worker
    under a name of its own (rank 3's slot), each row is the worker its rank ran as."""
    from hetflow.infra.report import plots
    from hetflow.infra.tracking.content import record_training
    from hetflow.records import Profile

    drawn = {}
    draw = plots.timeline

    def timeline(rank_records, path, **kw):
        drawn.update(rows=[[rec.step for rec in recs][:1] for recs in rank_records], **kw)
        return draw(rank_records, path, **kw)

    monkeypatch.setattr(plots, "timeline", timeline)
    cluster = ClusterSpec.from_speeds([1, 1, 2, 4])
    rid = tracker.start_run("optimized", cluster, DatasetSpec(url="s3://bucket/digits"))
    done = outcome("optimized", rid, [16, 16, 16, 16], 0.1)
    w0, w1, w2, w3 = done.result.ranks
    w1.records = w1.records[:3]
    w2.records = w2.records[2:]
    w3.worker, w3.records = "spare-7", w3.records[1:]
    done.result = RunResult(ranks=[w3, w0, w2], departed=[w1])  # ranks 3, 0, 2; 1 left
    record_training(tracker, done, Profile(cluster="local", model="digits-mlp", ranks=[]), cluster)
    assert drawn["labels"] == ["w0 · 1x", "w2 · 2x", "spare-7", "w1 · 1x (left before step 3)"]
    assert drawn["rows"] == [[0], [2], [1], [0]]
