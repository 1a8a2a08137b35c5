"""The loop's re-balancing turn (`rebalancing.rebalance`) on simulated steps, every row shared a
step late as `SharedStepTimes` brings it: a straggler that comes while a learned plan is on
trial (pure)."""

from __future__ import annotations

import random

import pytest

from hetflow.config import TrainConfig
from hetflow.training.loop.rebalancing import rebalance
from hetflow.training.loop.state import LoopState
from hetflow.training.plan.rebalancer import Rebalancer

SPEEDS = [1.0, 1.0, 3.0, 8.0]
ONSET, FACTOR, STEPS = 12, 8.0, 24


def run(seed: int, noise: float, fixed_s: float) -> list[tuple[int, list[int]]]:
    """A dynamic run of STEPS steps on SPEEDS from the equal split 8,8,16,32: each rank's step
    is (fixed_s + 4 ms a sample) / its speed, log-normal noise and one step in ten paused 1.5x;
    rank 3 FACTOR x slower from ONSET. The plans adopted, with their first steps."""
    rng = random.Random(seed)
    cfg = TrainConfig(
        recipe="digits-cnn",
        global_batch=64,
        steps=STEPS,
        schedule="dynamic",
        rebalance_threshold=0.3,
        rebalance_every=100,
        eval_every=100,
        checkpoint_every=100,
        target_accuracy=None,
    )
    reb = Rebalancer(64, [None] * 4, [0.0] * 4, None, threshold=0.3)
    state = LoopState.fresh([8, 8, 16, 32])
    late = None
    for step in range(STEPS):
        row = []
        for i, b in enumerate(state.plan):
            t = (fixed_s + 0.004 * b) / SPEEDS[i] * (FACTOR if i == 3 and step >= ONSET else 1.0)
            t *= 1.5 if rng.random() < 0.1 else 1.0
            row.append(t * rng.lognormvariate(0, noise))
        if late is not None:
            state.add_row(*late)
        late = (len(state.plans), step, row)
        rebalance(reb, state, cfg, step, False, step == STEPS - 1)
    return [(p.step, p.plan) for p in state.plans]


@pytest.mark.parametrize("noise,fixed_s", [(0.1, 0.05), (0.1, 0.2), (0.3, 0.05)])
def test_a_straggler_during_a_trial_moves_the_plan_off_it_within_a_few_steps(noise, fixed_s):
    # The first learned plan (step 7) gives rank 3 most of the batch and is on trial when it
    # slows down; the trial's own windows cannot tell the change (its batches are new), and
    # where the verdict stayed open no other plan was proposed for the rest of the run.
    for seed in range(12):
        plans = run(seed, noise, fixed_s)
        before = [p for s, p in plans if s <= ONSET][-1]
        moved = [p for s, p in plans if ONSET < s <= 20]
        assert moved and moved[0][3] < before[3], (seed, plans)
