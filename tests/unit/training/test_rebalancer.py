"""The re-balancer on simulated workers whose step time is not affine in the batch: it
settles after a change of speed and does not chase its own model's error (pure)."""

from __future__ import annotations

import random
import statistics

import pytest

from hetflow.training.loop.compute_times import step_spread
from hetflow.training.plan.balance import balance_batches
from hetflow.training.plan.rebalancer import Rebalancer

B, EVERY = 128, 10


def floored(a: float, c: float, floor: float):
    """A device whose step never gets shorter than `floor`, however small the batch (not
    saturated there): affine above it, flat below; no work at all for a batch of 0."""
    return lambda b: max(a + c * b, floor) if b else 0.0


def profiled(worker, sizes=(8, 16, 32, 64)) -> tuple[float, float]:
    """The affine fit a profile makes from batches 8 to 64."""
    c, a = statistics.linear_regression(list(sizes), [worker(b) for b in sizes])
    return a, c


def simulate(workers, slow_at=None, factor=3.0, who=3, steps=300, noise=0.08, seed=0, final=False):
    """Windows of EVERY steps: each rank's mean compute time (log-normal noise) and the
    window's spread, fed to the re-balancer, whose proposals are adopted at once. The steps at
    which it re-planned (and the plan it ended on, with `final`)."""
    rng = random.Random(seed)
    latency, per_sample = zip(*(profiled(w) for w in workers), strict=True)
    plan = balance_batches(per_sample, latency, B)
    reb = Rebalancer(B, [None] * len(workers), list(latency), list(per_sample))
    replans = []
    for start in range(0, steps, EVERY):
        slow = slow_at is not None and start >= slow_at
        rows = [
            [
                w(b) * (factor if slow and i == who else 1.0) * rng.lognormvariate(0, noise)
                for i, (w, b) in enumerate(zip(workers, plan, strict=True))
            ]
            for _ in range(EVERY)
        ]
        times = [statistics.mean(col) for col in zip(*rows, strict=True)]
        reb.observe(plan, times, step_spread(rows, plan), EVERY)  # as the loop feeds it
        new = reb.propose(plan, start + EVERY)
        if new is not None:
            replans.append(start + EVERY)
            plan = new
    return (replans, plan) if final else replans


EQUAL = [floored(0.01, 0.002, 0.08)] * 4
MIXED = [floored(0.01, 0.002 * k, 0.08) for k in (1, 2, 3, 6)]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("workers", [EQUAL, MIXED], ids=["equal", "mixed"])
def test_one_change_of_speed_settles_within_a_few_replans_and_stays(workers, seed):
    # a 3x slow-down at step 50: the plan moves off it (a revert and a step to leave it out
    # included) and then holds; a gain under twice the noise bar needs two windows to agree
    replans, plan = simulate(workers, slow_at=50, seed=seed, final=True)
    after = [s for s in replans if s > 50]
    assert 1 <= len(after) <= 4, replans
    assert len([s for s in replans if s > 150]) <= 1, replans  # and keeps the plan it reached
    slowed = [lambda b, w=w: 3.0 * w(b) for w in workers[3:]]
    now = [*workers[:3], *slowed]
    assert max(w(b) for w, b in zip(now, plan, strict=True)) <= _best_step(now) * 1.10


@pytest.mark.parametrize("seed", range(6))
def test_with_no_change_of_speed_a_good_static_plan_is_kept(seed):
    assert simulate(EQUAL, seed=seed) == []


@pytest.mark.parametrize("seed", range(6))
def test_a_plan_from_a_profile_that_is_wrong_at_small_batches_is_fixed_and_kept(seed):
    # MIXED's fast worker is flat below batch 35, where the profile's line is not: the first
    # plan is off by about 7%, within twice the bar the windows' 8% noise sets, so it is
    # fixed once two windows in a row agree (not at the first); a fix the windows do not show
    # faster is given up (a revert) and at most one other tried, and the plan ends near the best
    replans, plan = simulate(MIXED, seed=seed, final=True)
    assert 1 <= len(replans) <= 3, replans
    best = _best_step(MIXED)  # the start is 7% off it: within noise of it, never further
    assert max(w(b) for w, b in zip(MIXED, plan, strict=True)) <= best * 1.08


def _best_step(workers) -> float:
    """The shortest step any split of B gives (exhaustive over the slowest rank's time)."""
    from hetflow.perf.balance import fill

    steps = []
    for mask in range(1, 2 ** len(workers)):  # each worker left out or kept
        keep = [w for i, w in enumerate(workers) if mask >> i & 1]
        plan = fill([lambda b, w=w: w(b) for w in keep], B, [B] * len(keep))
        steps.append(max(w(b) for w, b in zip(keep, plan, strict=True)))
    return min(steps)


def test_a_proposal_must_beat_the_models_demonstrated_error():
    reb = Rebalancer(B, [None] * 2, [0.0, 0.0], [0.001, 0.001], threshold=0.1)
    assert reb.margin == pytest.approx(0.05)
    reb.trial = {"plan": [64, 64], "new": [80, 48], "step_s": 0.1, "se": 0.0, "predicted_s": 0.05}
    reb.observe([80, 48], [0.065, 0.065])  # predicted 0.05 s, measured 0.065 s: 30% off
    assert reb.errors == [pytest.approx(0.3)] and reb.margin == pytest.approx(0.3)
    # a model that predicts a 20% shorter step is not believed now; a 50% shorter one is
    reb.observe([80, 48], [0.060, 0.058])
    assert reb.propose([80, 48], 20) is None
    reb.observe([80, 48], [0.120, 0.050])
    assert reb.propose([80, 48], 30) is not None


def test_a_straggler_during_a_trial_does_not_stop_later_replans():
    # Worker 1 slows 3x while a trial plan runs (bench hetero --straggler, main cd4e9f5: the
    # trial failed, its error of +240% became the margin a proposal had to beat, and the plan
    # never moved off the straggler). The trial is reverted; once the old plan shows worker
    # 1's new speed, the model's errors from before the change no longer count.
    reb = Rebalancer(B, [None] * 2, [0.0, 0.0], [0.002, 0.001], threshold=0.1)
    reb.observe([43, 85], [0.086, 0.085])
    reb.trial = {"plan": [43, 85], "new": [38, 90], "step_s": 0.086, "se": 0.0, "predicted_s": 0.08}
    reb.observe([38, 90], [0.076, 0.27])  # 3x slower: the straggler, not the plan
    assert reb.propose([38, 90], 20) == [43, 85]  # reverted
    reb.observe([43, 85], [0.086, 0.255])
    assert reb.margin == pytest.approx(0.05)
    new = reb.propose([43, 85], 30)
    assert new is not None and new[0] > 43, new  # work moves off the straggler


def test_a_window_in_which_a_rank_did_not_compute_teaches_nothing_of_its_speed():
    # A worker that joined in place after the window began has no time in its rows: a mean
    # of 0 s at the share it was planned (a queue session's job, 0 s then a division by it:
    # `ZeroDivisionError` at the next window). Its curve keeps what was known.
    reb = Rebalancer(B, [None] * 2, [0.0, 0.0], [0.002, 0.001], threshold=0.1)
    reb.observe([64, 64], [0.128, 0.0], rows=5)
    assert reb.points[1] == {}
    reb.observe([64, 64], [0.128, 0.064], rows=5)
    assert reb.points[1] == {64: pytest.approx(0.064)}
