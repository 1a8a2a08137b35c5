"""Workers a plan leaves at batch 0 and that would only add to every all-reduce are not launched
(`planner.drop_from_launch`, `planner.launched`): a static plan's always, a dynamic plan's
where the all-reduce share they cost is more than 1% of the step (`IDLE_RANK_BUDGET`)."""

from __future__ import annotations

import pytest

from hetflow.config import ClusterSpec, TrainConfig
from hetflow.figures import RankFigures, RunMetrics
from hetflow.perf.collective import measured_ring
from hetflow.training.launch.spec import default_profile_batches
from hetflow.training.plan.planner import make_plan
from hetflow.training.plan.ranks import RankMap

from tests.helpers.training.drop_from_launch import _profile
from tests.profiles import profile_of, rank_profile


@pytest.mark.parametrize(
    ("schedule", "allreduce_s", "latency_s", "dropped"),
    [
        ("proportional", 0.0, 0.0, ["w2"]),  # nothing can bring it back: never launched
        # its quarter of the ring (0.5 ms) is 6.6% of the 7.6 ms step: over the 1% budget
        ("dynamic", 0.002, 0.0, ["w2"]),
        # bandwidth-bound, a quarter of 0.2 ms is 0.9% of the 5.8 ms step: kept for a re-plan
        ("dynamic", 0.0002, 0.0, []),
        # latency-bound, its hops are half of it (0.1 ms), 1.7% of the step: dropped
        ("dynamic", 0.0002, 0.0002, ["w2"]),
        ("equal", 0.002, 0.002, []),  # the equal split leaves no one out
    ],
)
def test_the_plan_drops_a_left_out_worker_by_what_its_all_reduce_share_costs(
    schedule, allreduce_s, latency_s, dropped
):
    profile = _profile(allreduce_s, latency_s)
    cluster = ClusterSpec.from_speeds([1, 1, 0.1])
    train = TrainConfig(global_batch=64, schedule=schedule, rebalance_threshold=0.05)
    plan = make_plan(profile, cluster, train)
    assert plan.dropped == dropped
    if schedule != "equal":
        assert plan.local_batches[2] == 0 and plan.excluded[0].startswith("w2: ")


def test_the_ring_all_reduce_scales_with_the_ranks_it_spans():
    assert measured_ring(0.003, 4, 1) == 0.0  # one rank reduces nothing
    assert measured_ring(0.003, 4, 4) == pytest.approx(0.003)
    assert measured_ring(0.003, 4, 2) == pytest.approx(0.003 * 0.5 / 0.75)
    # its fixed part is paid per hop: 2 hops of 6 from 4 ranks to 2
    assert measured_ring(0.003, 4, 2, latency_s=0.001) == pytest.approx(
        0.001 / 3 + 0.002 * 0.5 / 0.75
    )
    # a fitted latency beyond the whole (noise) counts as the whole
    assert measured_ring(0.003, 4, 2, latency_s=0.01) == pytest.approx(0.001)


def test_launched_renumbers_the_ranks_and_keeps_each_workers_slowdown():
    cluster = ClusterSpec.from_speeds([4, 1, 2, 1], time_scale=8.0)
    profile = profile_of(
        [
            rank_profile(0, 4000.0, fit_latency_s=0.004),
            rank_profile(1, 10.0, fit_latency_s=9.0),
            rank_profile(2, 2000.0, fit_latency_s=0.004),
            rank_profile(3, 1000.0, fit_latency_s=0.004),
        ]
    )
    plan = make_plan(profile, cluster, TrainConfig(global_batch=64, schedule="proportional"))
    assert plan.dropped == ["w1"]
    sub, sub_plan, stragglers = RankMap(cluster, plan).launched([(3, 5, 2.0), (1, 5, 3.0)])
    assert [w.name for w in sub.workers] == ["w0", "w2", "w3"]
    assert sub_plan.local_batches == [b for i, b in enumerate(plan.local_batches) if i != 1]
    assert sum(sub_plan.local_batches) == 64
    assert sub_plan.latency_s == [plan.latency_s[i] for i in (0, 2, 3)]
    assert stragglers == [(2, 5, 2.0)]  # w3's, renumbered; w1's went with it
    full = dict(zip([w.name for w in cluster.workers], cluster.slowdowns(), strict=True))
    assert dict(zip(["w0", "w2", "w3"], sub.slowdowns(), strict=True)) == {
        k: full[k] for k in ("w0", "w2", "w3")
    }
    # the fastest worker's cap is 0: the time scale follows the fastest one launched
    fast_out = ClusterSpec.from_speeds([4, 1], time_scale=8.0)
    capped = plan.model_copy(update={"dropped": ["w0"], "local_batches": [0, 64]})
    sub, _, _ = RankMap(fast_out, capped).launched()
    assert sub.slowdowns() == [fast_out.slowdowns()[1]]


def _gpu_and_cpus(cpu_batches: list[int]):
    """A GPU (7 ms a step, almost flat in the batch) beside three CPU workers (2 ms + 6.5 ms a
    sample), each measured at `cpu_batches`: the shape of the H100 + 3 CPU run of the small gpt
    in docs/measurements/gpu.md, whose plan was [125, 1, 1, 1]."""
    gpu = rank_profile(0, 3700.0, fit_latency_s=0.007, fit_s_per_sample=4e-5)
    cpus = [
        rank_profile(r, 150.0, fit_latency_s=0.002, fit_s_per_sample=0.0065) for r in range(1, 4)
    ]
    measured = {"compute_batches": cpu_batches}
    return profile_of(
        [gpu.model_copy(update={"compute_batches": [8, 16, 32, 64]})]
        + [c.model_copy(update=measured) for c in cpus]
    )


def test_a_share_below_the_smallest_measured_batch_goes_to_the_others_when_they_are_faster():
    cluster = ClusterSpec.from_speeds([1, 1, 1, 1])
    static = TrainConfig(global_batch=128, schedule="proportional")
    unmeasured = make_plan(_gpu_and_cpus([]), cluster, static)  # no floor: the model as fitted
    assert unmeasured.local_batches == [125, 1, 1, 1] and unmeasured.dropped == []
    # each CPU worker takes 54 ms at batch 8, the GPU 12 ms for all 128
    plan = make_plan(_gpu_and_cpus([8, 16, 32, 64]), cluster, static)
    assert plan.local_batches == [128, 0, 0, 0]
    assert plan.dropped == ["w1", "w2", "w3"]
    assert "its step of 0.054 s at 8 samples, the fewest it was measured at," in plan.excluded[0]


def test_a_share_below_the_measured_batches_stays_where_its_measured_step_is_shorter():
    from hetflow.training.plan.balance import balance_with_exclusion

    # two equal workers measured from 40 on, sharing 64: either at 40 is quicker than one alone
    batches, why = balance_with_exclusion([0.001, 0.001], [0.01, 0.01], 64, min_batches=[40, 40])
    assert batches == [32, 32] and why == []


def test_auto_compression_is_planned_for_the_workers_launched():
    cluster = ClusterSpec.from_speeds([1, 1, 0.1])
    train = TrainConfig(global_batch=64, schedule="proportional", compression="auto")
    two = make_plan(_profile(0.001), cluster, train)  # w2 dropped: two workers try candidates
    assert two.dropped == ["w2"] and two.compression_candidates
    lone = _profile(0.001).model_copy(update={"ranks": _profile(0.001).ranks[1:]})
    one = make_plan(lone, ClusterSpec.from_speeds([1, 0.1]), train)  # one left: nothing to try
    assert one.dropped == ["w1"] and one.compression_candidates == []
    assert one.compression_reason.startswith("'auto' on one worker")


def test_a_run_going_on_without_lost_workers_keeps_the_global_batch_and_says_who_and_why():
    """`replan_without` shares the global batch among the workers left (on the plan's step
    model where it has one, else in the ratio of their shares), and `RankMap` renumbers them:
    the path a Ray run takes when a lost node has no replacement."""
    from hetflow.records import Plan, RankResult, Recovery, RunResult
    from hetflow.training.plan.balance import PlanError
    from hetflow.training.plan.planner import replan_without

    cluster = ClusterSpec.from_speeds([2, 1, 3])
    train = TrainConfig(global_batch=48, schedule="proportional")
    plan = replan_without(cluster, Plan.equal([16, 8, 24]), {"w1": "node lost"}, train)
    assert plan.local_batches == [19, 0, 29] and plan.dropped == ["w1"]
    assert plan.excluded == ["w1: node lost"]
    sub, sub_plan, _ = RankMap(cluster, plan).launched()
    assert [w.name for w in sub.workers] == ["w0", "w2"] and sum(sub_plan.local_batches) == 48
    modelled = Plan(local_batches=[16, 16, 16], latency_s=[0.0] * 3, per_sample_s=[1e-3, 1, 5e-4])
    assert replan_without(cluster, modelled, {"w1": "gone"}, train).local_batches == [16, 0, 32]
    # the result's two ranks are the cluster's w0 and w2 in MLflow's per-rank names
    lead = RankResult(rank=0, records=[], plans=[], recovery=Recovery(left_out={"w1": "gone"}))
    ran = RankMap(cluster, Plan.equal([16, 8, 24])).finished(RunResult(ranks=[lead]))
    launched = RunMetrics(
        ranks=[RankFigures(rank=r, local_batch=b, busy_fraction=0.5) for r, b in ((0, 19), (1, 29))]
    )
    assert {k: v for k, v in ran.to_cluster(launched).flat().items() if "/" in k} == {
        "rank0/local_batch": 19,
        "rank0/busy_fraction": 0.5,
        "rank1/local_batch": 0,
        "rank1/busy_fraction": 0.0,
        "rank2/local_batch": 29,
        "rank2/busy_fraction": 0.5,
    }
    everyone = {"w0": "gone", "w1": "gone", "w2": "gone"}
    with pytest.raises(PlanError, match=r"^cluster: no worker is left to go on with: w0: gone;"):
        replan_without(cluster, Plan.equal([16, 8, 24]), everyone, train)


def test_a_checkpoint_resumes_on_fewer_workers_each_keeping_its_own_records():
    from hetflow.records import StepRecord
    from hetflow.training.loop.state import Checkpoint, LoopState

    def rec(step_s: float) -> dict:
        fields = {"data_s": 0.0, "wait_s": 0.0, "loss_sum": 1.0, "bytes_sent": 0.0}
        return StepRecord(step=8, batch=1, compute_s=step_s, step_s=step_s, **fields).model_dump()

    saved = {
        "step": 9,
        "workers": ["a", "b", "c"],
        "model": {},
        "optimizer": {},
        "plan": [16, 8, 24],
        "plans": [{"step": 0, "plan": [16, 8, 24]}],
        "evals": [],
        "train_time": 1.0,
        "records": [[rec(0.1)], [rec(0.2)], [rec(0.3)]],
        "rebalancer": {
            "per_sample_s": [1.0, 2.0, 3.0],
            "points": [[(16, 0.1)], [(8, 0.2)], [(24, 0.3)]],
            "latest": [16, 8, 24],
            "replans": [],
            "rejected": [[10, 10, 28]],
            "trial": None,
            "revert_to": [16, 8, 24],
            "errors": [0.1],
        },
    }
    ckpt = Checkpoint.from_dict(saved, ["a", "b", "c"])
    out = ckpt.narrowed(["a", "c"], [19, 29])
    assert [r[0].step_s for r in out.records] == [0.1, 0.3] and out.plan == [19, 29]
    assert out.plans[-1].model_dump() == {"step": 9, "plan": [19, 29]}
    reb = out.rebalancer
    assert reb["per_sample_s"] == [1.0, 3.0] and reb["latest"] == [16, 24]
    assert reb["rejected"] == [] and reb["revert_to"] is None and reb["errors"] == [0.1]
    state = LoopState.from_checkpoint(out, 1)
    assert state.plan == [19, 29] and state.start == 9 and state.records[0].step_s == 0.3
    again = Checkpoint.from_dict(out.to_dict(), [])  # what the store saves reads back alike
    assert again == out
    with pytest.raises(ValueError, match=r"workers \['d'\] were not in the run"):
        ckpt.narrowed(["a", "d"], [24, 24])
    moved = ckpt.moved(["d", "a"], [24, 24])  # the queue's: a new worker, the re-balancer afresh
    assert moved.workers == ["d", "a"] and moved.rebalancer is None
    assert moved.records == [[], []] and moved.model == ckpt.model
    assert LoopState.from_checkpoint(moved, 0).start == 9
    assert Checkpoint.from_dict(moved.to_dict(), []) == moved
    assert ckpt.moved(["a", "c"], [19, 29]) == out


def _emulated_cpus(speeds: list[float], measured: list[int]):
    """CPU workers whose whole step (50 ms fixed + 20 ms a sample at speed 1) is dilated by
    1 / speed, as the emulator slows a worker, each measured at the batches `measured`."""
    return profile_of(
        [
            rank_profile(r, s / 0.07, fit_latency_s=0.05 / s, fit_s_per_sample=0.02 / s).model_copy(
                update={"compute_batches": measured}
            )
            for r, s in enumerate(speeds)
        ]
    )


def test_the_default_profile_batches_reach_the_shares_slow_workers_get():
    """The small gpt (docs/measurements/recipes.md), global batch 32, speeds 1,1,2,4: timed
    from batch 8 only, the slow pair's step at 8 (210 ms) passes what the others take without
    them, so the static plan left out two workers that the re-balancer then brought back; timed
    where the profile now starts at that batch (2), both stay, sharing a 105 ms step."""
    cluster = ClusterSpec.from_speeds([1, 1, 2, 4])
    static = TrainConfig(global_batch=32, schedule="proportional")
    from_eight = make_plan(_emulated_cpus([1, 1, 2, 4], [8, 16, 32, 64]), cluster, static)
    assert from_eight.dropped == ["w0", "w1"]
    sizes = default_profile_batches(32, 4)
    plan = make_plan(_emulated_cpus([1, 1, 2, 4], sizes), cluster, static)
    assert plan.dropped == [] and all(plan.local_batches) and sum(plan.local_batches) == 32
    assert sizes[0] <= min(plan.local_batches)  # the smallest share is timed, not extrapolated


@pytest.mark.parametrize(
    ("allreduce_s", "latency_s", "left_out"),
    [
        (0.0, 0.0, False),  # no all-reduce: every sample helps, w2 computes its share
        # latency-bound 20 ms over 3 ranks: w2's 8 samples buy 3.7 ms of the others' compute,
        # its hop of the ring costs 10 ms
        (0.02, 0.02, True),
        (0.002, 0.0, False),  # a 2 ms bandwidth-bound all-reduce: its hop is worth less
    ],
)
def test_a_worker_whose_samples_buy_less_than_its_hops_of_the_all_reduce_is_left_out(
    allreduce_s, latency_s, left_out
):
    fig = {"grad_allreduce_s": allreduce_s, "allreduce_latency_s": latency_s}
    fast = [rank_profile(r, 1000.0, fit_latency_s=0.01, **fig) for r in range(2)]
    slow = rank_profile(2, 333.3, fit_latency_s=0.03, **fig)  # 3x slower, its fixed cost too
    for schedule in ("proportional", "dynamic"):
        train = TrainConfig(global_batch=128, schedule=schedule)
        plan = make_plan(profile_of([*fast, slow]), ClusterSpec.from_speeds([3, 3, 1]), train)
        assert (plan.local_batches[2] == 0) == left_out
        assert sum(plan.local_batches) == 128
        assert any("all-reduce" in why for why in plan.excluded) == left_out
        assert plan.dropped == (["w2"] if left_out else [])  # never launched, then
