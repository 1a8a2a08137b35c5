"""The loop's re-balancing turn (`rebalancing.rebalance`) on simulated steps, every row shared a
step late as `SharedStepTimes` brings it: a straggler that comes while a learned plan is on
trial (`benchmarks.trial_straggler`, which reports the same over more seeds and settings;
pure)."""

from __future__ import annotations

import pytest

from benchmarks.trial_straggler import SPEEDS, moved_off, run


@pytest.mark.parametrize("noise,fixed_s", [(0.1, 0.05), (0.1, 0.2), (0.3, 0.05)])
def test_a_straggler_during_a_trial_moves_the_plan_off_it_within_a_few_steps(noise, fixed_s):
    # The first learned plan (step 7) gives rank 3 most of the batch and is on trial when it
    # slows down; the trial's own windows cannot tell the change (its batches are new), and
    # where the verdict stayed open no other plan was proposed for the rest of the run.
    for seed in range(12):
        plans = run(SPEEDS["1,1,3,8"], seed, noise, fixed_s)
        assert moved_off(plans), (seed, plans)


def test_a_plan_adopted_starts_its_window_afresh():
    """After a regroup in place the plan is re-cut without the window being observed: the
    rows taken under the plan before must not be paired with the new plan's batches (a
    joiner's 0 s under the old plan became a point, and a ZeroDivisionError)."""
    from hetflow.training.loop.state import SETTLE_STEPS, LoopState

    state = LoopState.fresh([8, 8])
    state.add_row(len(state.plans), SETTLE_STEPS, [0.1, 0.0])
    assert state.window and state.current
    state.adopt([4, 12], SETTLE_STEPS + 1)
    assert state.window == [] and state.current == []
