"""The learner on devices no affine model fits, at both measured noise levels, and under
stragglers that jump or drift in: it never ends below the plan it started from, settles near
the best plan, re-plans little after it has learned, and moves off a straggler at once.

The training loop's own turn (`loop.rebalancing.rebalance`, with its `LoopState`) is driven
here by `emulation.device_model.EmulatedCluster` (`benchmarks.learner`, which reports the same
figures over more seeds): each device its own published curve, noise
`alone` (a worker with a core to itself) or `shared` (workers sharing a host: CV 0.2, slow
stretches of several steps, pauses). A plan is graded by what its steps cost under that noise
(the mean over many steps of the slowest rank's time), not by the model's prediction (pure).
"""

from __future__ import annotations

import pytest

from hetflow.emulation.device_model import Device
from hetflow.training.loop.state import LoopState

from benchmarks.learner import MIXES, best_plan, paid, run


def changes_after(state: LoopState, step: int) -> int:
    """Plans that came in after `step` (returns to a plan measured before included)."""
    return sum(p.step > step for p in state.plans[1:])


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("noise", ["alone", "shared"])
@pytest.mark.parametrize("mix", list(MIXES))
def test_the_learner_never_ends_below_its_start_and_settles_near_the_best(mix, noise, seed):
    devices = MIXES[mix]
    state, *_ = run(devices, noise, seed)
    start, final = state.plans[0].plan, state.plan
    assert paid(devices, final, noise) < paid(devices, start, noise), state.plans
    # near the best plan: within 10% on a worker's own core; within 45% on a shared host,
    # where one window's mean moves by 10-20% and a trial that its windows do not show
    # faster is given up
    best = paid(devices, best_plan(devices), noise)
    assert paid(devices, final, noise) <= best * (1.20 if noise == "alone" else 1.45), state.plans
    assert changes_after(state, 30) <= 3, state.plans


@pytest.mark.parametrize("seed", range(6))
def test_equal_devices_under_the_shared_hosts_noise_keep_the_equal_split(seed):
    # a first window of four steps can show a rank 50% slower (a pause, a slow stretch): the
    # plan it proposes is tried, and stays only where its windows measured no longer a step
    # than that first window did; one first window is a poor measure, so such a plan can cost
    # a few percent (6% in one of six seeds here), never more
    state, *_ = run([Device(preset="v100")] * 4, "shared", seed)
    devices = [Device(preset="v100")] * 4
    equal = paid(devices, [32] * 4, "shared")
    assert paid(devices, state.plan, "shared") <= equal * 1.10, state.plans
    assert len(state.plans) <= 3, state.plans


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("noise", ["alone", "shared"])
@pytest.mark.parametrize("ramp", [0, 20])
def test_a_straggler_that_jumps_or_drifts_in_is_left_within_a_few_replans(ramp, noise, seed):
    devices = MIXES["1,1,2,4"]
    straggler = (3, 60, 4.0, ramp)
    state, reb, _ = run(devices, noise, seed, stragglers=[straggler])
    after = [p.step for p in state.plans[1:] if p.step > 60]
    # a jump: moved off within a few steps, at most one refinement; a drift: one plan per
    # stretch of its ramp the plan no longer fits, at most three (returns to a plan measured
    # before, when a refinement's windows do not show it faster, not counted)
    assert after and after[0] <= 60 + ramp + (15 if noise == "alone" else 25), state.plans
    replans = [h for h in reb.history if h["step"] > 60 and "reverted" not in h]
    assert len(replans) <= (2 if ramp == 0 else 3), reb.history
    slowed = best_plan(devices, [1.0, 1.0, 1.0, 4.0])
    now = dict(stragglers=[straggler], at=100)
    assert paid(devices, state.plan, noise, **now) <= paid(devices, slowed, noise, **now) * 1.25
