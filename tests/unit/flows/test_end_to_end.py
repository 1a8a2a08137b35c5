"""Every cost a variant pays, counted from the start of its job: the profile where
its plan needs one, launch and set-up, 'auto''s trials, evaluations and checkpoints, and the
steps' own wall clock."""

from __future__ import annotations

import pytest

from hetflow.config import TrainConfig
from hetflow.infra.report.table import headline, summary, table_metrics
from hetflow.records import EvalPoint, PlanChange, RankResult, RunResult, StepRecord, Timeline
from hetflow.training.metrics import end_to_end, needs_profile, summarize


def _result(timeline: Timeline, evals: list[EvalPoint]) -> RunResult:
    records = [
        StepRecord(
            step=s,
            batch=64,
            data_s=0.0,
            compute_s=0.1,
            wait_s=0.0,
            step_s=0.1,
            loss_sum=1.0,
            bytes_sent=0.0,
        )
        for s in range(11)
    ]
    lead = RankResult(
        rank=0,
        records=records,
        plans=[PlanChange(step=0, plan=[64])],
        evals=evals,
        timeline=timeline,
    )
    return RunResult(ranks=[lead])


def test_the_steps_wall_clock_counts_what_happens_between_them_but_not_evaluation():
    line = Timeline(first_step_s=4.0, steady_from_s=4.3, loop_end_s=6.8, trials_s=1.5, eval_s=0.5)
    m = summarize(_result(line, []), global_batch=64)
    assert m.throughput_samples_per_s == pytest.approx(640.0)  # 10 steps of 0.1 s
    assert m.steady_samples_per_s == pytest.approx(64 * 10 / 2.0)  # 2.5 s less 0.5 of eval
    assert (m.startup_s, m.trials_s, m.steps_wall_s) == (4.0, 1.5, pytest.approx(2.8))


def test_a_resumed_run_counts_only_the_steps_its_own_wall_clock_covers():
    """Resumed at step 6 of 11: its records hold steps 0-10, its clock only 6-10; the steady
    rate counts steps 7-10 (after this process's warm-up step) over their 1 s."""
    line = Timeline(first_step=6, first_step_s=4.0, steady_from_s=4.2, loop_end_s=5.2)
    m = summarize(_result(line, []), global_batch=64)
    assert m.steady_samples_per_s == pytest.approx(64 * 4 / 1.0)


def test_a_run_that_recorded_no_timeline_has_no_wall_figures():
    assert summarize(_result(Timeline(), []), global_batch=64).startup_s is None


def test_end_to_end_time_to_target_adds_the_profile_to_the_wall_clock_of_the_hit():
    hit = EvalPoint(step=10, train_time_s=1.0, wall_s=7.5, accuracy=0.9)
    m = summarize(_result(Timeline(loop_end_s=8.0), [hit]), 64, target_accuracy=0.85)
    assert (m.time_to_target_s, m.time_to_target_wall_s) == (1.0, 7.5)
    e2e = end_to_end(m, run_s=9.0, profiling_time_s=4.0)
    assert (e2e.profiling_time_s, e2e.end_to_end_s) == (4.0, 13.0)
    assert (e2e.run_time_s, e2e.end_to_end_time_to_target_s) == (9.0, 11.5)


def test_only_a_plan_made_from_a_profile_before_step_0_pays_for_it():
    assert not needs_profile(TrainConfig(schedule="equal", compression="none"))
    assert not needs_profile(TrainConfig(schedule="equal", compression="auto"))  # trials: own
    assert needs_profile(TrainConfig(schedule="proportional", compression="none"))
    assert not needs_profile(TrainConfig(schedule="dynamic"))  # learns from its own steps
    assert needs_profile(TrainConfig(schedule="dynamic", profile_first=True))


def test_the_comparison_leads_with_end_to_end_time_and_says_what_it_includes():
    base = {
        "end_to_end_time_to_target_s": 20.0,
        "end_to_end_s": 30.0,
        "train_loop_s": 9.0,
        "throughput_samples_per_s": 100.0,
        "profiling_time_s": 0.0,
    }
    opt = {
        **base,
        "end_to_end_time_to_target_s": 25.0,
        "throughput_samples_per_s": 200.0,
        "profiling_time_s": 8.0,
    }
    assert table_metrics(opt)[:3] == [
        "end_to_end_time_to_target_s",
        "end_to_end_s",
        "profiling_time_s",
    ]
    h = headline(base, opt)
    assert h["end_to_end_time_to_target_ratio"] == pytest.approx(1.25)  # slower, all counted
    assert h["speedup"] == 2.0
    assert summary(h).startswith("optimized: reaches the target in 1.25x the time from submit")


def test_bytes_on_the_wire_keep_a_ring_share_s_fraction():
    """A ring all-reduce counts 2(n-1)/n of the bytes from each rank: not a whole number."""
    result = _result(Timeline(), [])
    for rec in result.ranks[0].records:
        rec.bytes_sent = 1000 * 2 * 2 / 3
    m = summarize(result, global_batch=64)
    assert m.comm_bytes_total == pytest.approx(11 * 4000 / 3)
    assert m.flat()["rank0/comm_bytes"] == m.comm_bytes_total
