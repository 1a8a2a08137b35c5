"""The queue's policies replayed on the step-time model (pure): every job ends, no worker
is held twice at once, a preemption waits for the next checkpoint and redoes nothing."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetflow.config import ConfigError
from hetflow.queue.jobs import Job, Kind, Line
from hetflow.queue.replay import POLICIES, Arrival, replay

KINDS = {"fast": Kind("fast", 80), "slow": Kind("slow", 16)}
WORKERS = {"f0": "fast", "f1": "fast", "s0": "slow", "s1": "slow"}


def job(name, priority="normal", speedup=4.0, steps=400, every=100, memory_gb=4.0):
    lines = {"slow": Line(0.01, 0.01), "fast": Line(0.01, 0.01 / speedup)}
    return Job(name, priority, 32, steps, memory_gb, lines, checkpoint_every=every)


def test_a_high_priority_arrival_starts_at_the_next_checkpoint_and_nothing_is_redone():
    low = Arrival(job("low", "low"), 0.0, 4)
    high = Arrival(job("high", "high"), 5.0, 4)
    restart = 1.0
    out = replay([low, high], WORKERS, KINDS, "preempt", restart)
    interval = 100 * 0.01 * 2  # 100 steps of `low` on its slowest worker at most
    assert out.wait_s["high"] <= interval + restart
    assert out.redone_steps == 0 and out.restarts >= 1
    waited = replay([low, high], WORKERS, KINDS, "packed", restart)
    assert waited.wait_s["high"] > out.wait_s["high"]  # without preemption it waits longer


def test_fifo_is_blind_to_speed_and_the_allocator_is_not():
    """Two jobs asking for two workers each: FIFO gives the first arrival the first two
    workers (fast), the allocator gives them to the job that gains most there."""
    cnn = Arrival(job("cnn", speedup=1.1, steps=2000), 0.0, 2)
    gpt = Arrival(job("gpt", speedup=8.0, steps=2000), 0.0, 2)
    fifo = replay([cnn, gpt], WORKERS, KINDS, "fifo", 0.0)
    packed = replay([cnn, gpt], WORKERS, KINDS, "packed", 0.0)
    holders = {w: j for j, w, _, _ in fifo.spans}
    assert holders["f0"] == holders["f1"] == "cnn"
    assert {w for j, w, _, _ in packed.spans if j == "gpt"} >= {"f0", "f1"}
    assert packed.avg_jct_s < fifo.avg_jct_s


arrivals = st.lists(
    st.tuples(
        st.sampled_from(["high", "normal", "low"]),
        st.floats(1.0, 8.0),
        st.integers(50, 400),
        st.floats(0, 20),
        st.integers(1, 4),
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=40, deadline=None)
@given(spec=arrivals, policy=st.sampled_from(POLICIES))
def test_every_job_ends_and_no_worker_is_held_twice_at_once(spec, policy):
    jobs = [
        Arrival(job(f"j{i}", p, s, steps, every=25), at, req)
        for i, (p, s, steps, at, req) in enumerate(spec)
    ]
    out = replay(jobs, WORKERS, KINDS, policy, 0.5)
    assert set(out.jct_s) == {a.job.name for a in jobs}
    assert all(out.wait_s[n] >= 0 and out.jct_s[n] > out.wait_s[n] for n in out.jct_s)
    assert out.redone_steps == 0
    for w in WORKERS:
        spans = sorted((a, b) for _, x, a, b in out.spans if x == w)
        assert all(b1 <= a2 + 1e-6 for (_, b1), (a2, _) in pairwise(spans))
    if policy != "preempt":
        assert out.restarts == 0


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--restart-s", "-1"], "--restart-s: "),
        (["--interval-scale", "0"], "--interval-scale: "),
        (["--real", "--repeats", "0"], "--repeats: at least 1"),
        (["--real", "--real-steps", "1"], "--real-steps: at least 2"),
        (["--real", "--real-speeds", "t4,h100"], "--real-speeds: not a preset: 'h100'"),
    ],
)
def test_the_benchmark_refuses_a_negative_restart_and_no_interval(flags, line, monkeypatch):
    import benchmarks.queue as bench

    monkeypatch.setattr(bench, "compare", None)  # nothing may be replayed
    with pytest.raises(ConfigError) as e:
        bench.main(flags)
    assert str(e.value).startswith(line) and "\n" not in str(e.value)


def test_the_speedup_sweep_moves_only_the_transformer_and_keeps_fifo_blind():
    """Power 0: the transformer gains nothing on a fast kind; 1: the replay as set. FIFO's
    wait for the high job does not read speeds, so it moves only through the jobs' lengths."""
    import benchmarks.queue as bench

    rows = {r["gpt_power"]: r for r in bench.sweep(20.0, 1.0)}
    assert rows[0.0]["gpt_speedups"] == (1.0, 1.0, 1.0)
    assert rows[1.0]["gpt_speedups"] == bench.SPEEDUPS["gpt"]
    same = {r["policy"]: r for r in bench.compare(20.0, 1.0)}
    assert rows[1.0]["preempt_vs_fifo"] == same["preempt"]["avg_jct_vs_fifo"]
    assert len({r["fifo_avg_jct_s"] for r in rows.values()}) > 1


def test_the_real_comparison_pairs_each_repeat_and_takes_each_figures_own_median():
    from benchmarks.queue_real import aggregate, rotated

    def run(repeat, policy, avg, high):
        return {
            "repeat": repeat,
            "policy": policy,
            "avg_job_completion_s": avg,
            "makespan_s": avg * 2,
            "high_wait_s": high,
            "train_over_launch": 1.0,
            "wait_s": {"high": high},
            "completion_s": {"high": avg},
        }

    runs = [
        run(0, "fifo", 100.0, 50.0),
        run(0, "allocator", 80.0, 10.0),
        run(1, "allocator", 90.0, 30.0),
        run(1, "fifo", 90.0, 40.0),
        run(2, "fifo", 120.0, 60.0),
        run(2, "allocator", 60.0, 20.0),
    ]
    out = aggregate(runs)
    assert out["allocator_vs_fifo"] == {
        "per_repeat": [0.8, 1.0, 0.5],
        "median": 0.8,
        "range": [0.5, 1.0],
    }
    assert out["fifo"]["avg_job_completion_s"] == 100.0
    assert out["fifo"]["avg_job_completion_s_range"] == [90.0, 120.0]
    assert out["allocator"]["high_wait_s"] == 20.0
    assert out["allocator"]["wait_s"]["high"] == (20.0, [10.0, 30.0])
    assert [rotated(["t4", "v100", "a100"], r)[0] for r in range(3)] == ["t4", "v100", "a100"]
    # a job that failed in one session (no figure there) is the median of the others
    runs[5]["wait_s"], runs[5]["completion_s"] = {}, {}
    runs[4]["wait_s"]["late"] = 7.0
    out = aggregate(runs)
    assert out["allocator"]["wait_s"]["high"] == (20.0, [10.0, 30.0])
    assert out["fifo"]["wait_s"]["late"] == (7.0, [7.0, 7.0])
    # the allocator measuring first, a third variant of the same repeats: its own ratio
    assert "allocator-measured" not in out and "allocator-measured_vs_fifo" not in out
    runs += [run(0, "allocator-measured", 120.0, 30.0), run(2, "allocator-measured", 60.0, 5.0)]
    out = aggregate(runs)
    assert out["allocator-measured_vs_fifo"]["per_repeat"] == [1.2, 0.5]
    assert out["allocator_vs_fifo"]["per_repeat"] == [0.8, 1.0, 0.5]
    assert out["allocator-measured"]["high_wait_s"] == 17.5
    runs.append(run(1, "allocator-equal", 45.0, 9.0))
    assert aggregate(runs)["allocator-equal_vs_fifo"]["per_repeat"] == [0.5]


@pytest.mark.parametrize("case", ["three", "queued"])
def test_every_job_of_the_real_bench_asks_fifo_for_one_worker(case):
    """FIFO at the setting of the comparison: each job takes one free worker. A job asking
    for none takes every worker that holds it, and a later job waits for the whole cluster
    (the queued case's two later jobs did before: their waits leaned the comparison)."""
    from benchmarks.queue_real import real_jobs

    jobs = real_jobs(160, case=case)
    assert len(jobs) == {"three": 3, "queued": 5}[case]
    assert all(j.workers == 1 for j in jobs)
