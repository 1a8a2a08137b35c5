"""The optimized run learns from its own steps: a prior for step 0, curves from the steps, plans
on curves that are not lines, decisions that beat the measured noise, and what a run learned
stored in the profile history for the next one.

The re-balancer is pure and is driven here by simulated workers whose step follows the
emulation's device presets (`emulation.presets`: published per-batch latencies, flat below a
knee, a bump on the A100) or a line, with log-normal noise; the history is real S3 (the local
store over moto's HTTP server); the slow test trains through the train flow with torchrun.
"""

from __future__ import annotations

import pytest

import hetflow.tasks.history as history_task
from hetflow.config import ClusterSpec, DatasetSpec, TrainConfig
from hetflow.infra.s3 import local_s3_endpoint
from hetflow.records import PlanChange, RankResult, RunResult, StepRecord
from hetflow.training.plan.planner import make_plan
from hetflow.training.plan.prior import EQUAL, prior_kind

# -- what a run learned, in the history -------------------------------------------------------


def _run(batches_by_step: list[list[int]], pace: list[float]) -> RunResult:
    ranks = []
    plans = [PlanChange(step=0, plan=batches_by_step[0])]
    for s in range(1, len(batches_by_step)):
        if batches_by_step[s] != batches_by_step[s - 1]:
            plans.append(PlanChange(step=s, plan=batches_by_step[s]))
    for k, c in enumerate(pace):
        recs = [
            StepRecord(
                step=s,
                batch=p[k],
                data_s=0,
                compute_s=0.01 + c * p[k],
                wait_s=0,
                step_s=0,
                loss_sum=0,
                bytes_sent=0,
            )
            for s, p in enumerate(batches_by_step)
        ]
        ranks.append(RankResult(rank=k, records=recs, plans=plans, params=1000))
    return RunResult(ranks=ranks)


def test_what_a_run_learned_is_the_next_runs_prior(
    tmp_path, hetflow_home, prefect_harness, monkeypatch
):
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    dataset = DatasetSpec(url=(tmp_path / "d").as_uri())
    cluster = ClusterSpec.from_speeds([1, 4])
    train = TrainConfig(global_batch=64)
    result = _run([[32, 32]] * 10 + [[13, 51]] * 10, [0.004, 0.001])
    with local_s3_endpoint(dataset.url):
        first = history_task.prior_or_history.fn(cluster, dataset, train)
        assert first.sources == [EQUAL] * 2
        stored = history_task.store_learned(cluster, dataset, train, result)
        again = history_task.prior_or_history.fn(cluster, dataset, train)
    assert len(stored) == 2 and all("training run" in e.link_source for e in stored)
    assert stored[0].rank.fit_latency_s == pytest.approx(0.01)
    assert stored[0].rank.fit_s_per_sample == pytest.approx(0.004)
    assert all(s.startswith("prior: the profile history, s3://") for s in again.sources)
    plan = make_plan(again, cluster, train)
    assert plan.local_batches[1] > 3 * plan.local_batches[0]  # planned from what it measured


def test_a_cluster_of_presets_takes_their_published_ratios_unless_told_not_to(
    tmp_path, hetflow_home, prefect_harness, monkeypatch
):
    """With no history, workers that name presets are planned from the presets' published
    ratios; `published=False` (the queue's `published_prior`) makes that the equal split."""
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    dataset = DatasetSpec(url=(tmp_path / "d").as_uri())
    cluster = ClusterSpec.from_speeds(["t4", "a100"])
    train = TrainConfig(global_batch=64)
    with local_s3_endpoint(dataset.url):
        published = history_task.prior_or_history.fn(cluster, dataset, train)
        equal = history_task.prior_or_history.fn(cluster, dataset, train, published=False)
    assert [prior_kind(s) for s in published.sources] == [
        "the published curve of preset t4",
        "the published curve of preset a100",
    ]
    assert published.ranks[0].fit_s_per_sample > published.ranks[1].fit_s_per_sample
    assert equal.sources == [EQUAL] * 2
