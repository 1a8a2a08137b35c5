"""`hetflow bench trial_straggler`: a straggler that comes while a learned plan is on trial
(pure, in seconds).

    hetflow bench trial_straggler                 # 30 seeds a setting
    hetflow bench trial_straggler --seeds 100 --json trial.json

The training loop's own turn (`loop.rebalancing.rebalance`, its `LoopState`) on a dynamic run of
STEPS steps from the equal split 8,8,16,32 on workers of speeds 1,1,3,8 (or 1,1,2,4), whose
step is (a fixed cost + 4 ms a sample) / its speed, with log-normal noise and one step in ten
paused `--pause` x (1.5; a full suite's neighbours paused single steps 3-8x); every row
shared a step late, as `SharedStepTimes` brings it. The first learned
plan (about step 7) gives the fast rank 3 most of the batch and is on trial when rank 3 slows
FACTOR x at ONSET: the case where the trial's verdict could stay open and the plan stay on the
straggler. Per setting: the runs whose first plan after the onset, by step MOVE_BY, did not
give rank 3 less than the plan in force at the onset ("stuck"). The run's own test
(tests/unit/training/test_rebalancing_loop.py) holds a few of these settings.
"""

from __future__ import annotations

import argparse
import random

from hetflow.cli.args import Parser
from hetflow.config import ConfigError, TrainConfig
from hetflow.training.loop.rebalancing import rebalance
from hetflow.training.loop.state import LoopState
from hetflow.training.plan.rebalancer import Rebalancer

from benchmarks import write_json

ONSET, FACTOR, STEPS, MOVE_BY = 12, 8.0, 24, 20
SPEEDS = {"1,1,3,8": [1.0, 1.0, 3.0, 8.0], "1,1,2,4": [1.0, 1.0, 2.0, 4.0]}
SETTINGS = [(0.05, 0.1), (0.05, 0.3), (0.2, 0.1), (0.2, 0.3)]  # (fixed cost s, noise CV)


def run(
    speeds: list[float], seed: int, noise: float, fixed_s: float, pause: float = 1.5
) -> list[tuple[int, list[int]]]:
    """One run (see the module); the plans adopted, with their first steps."""
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
            t = (fixed_s + 0.004 * b) / speeds[i] * (FACTOR if i == 3 and step >= ONSET else 1.0)
            t *= pause if rng.random() < 0.1 else 1.0
            row.append(t * rng.lognormvariate(0, noise))
        if late is not None:
            state.add_row(*late)
        late = (len(state.plans), step, row)
        rebalance(reb, state, cfg, step, False, step == STEPS - 1)
    return [(p.step, p.plan) for p in state.plans]


def moved_off(plans: list[tuple[int, list[int]]]) -> bool:
    """Whether the first plan after ONSET, by MOVE_BY, gives rank 3 less than the plan in
    force at ONSET."""
    before = [p for s, p in plans if s <= ONSET][-1]
    moved = [p for s, p in plans if ONSET < s <= MOVE_BY]
    return bool(moved) and moved[0][3] < before[3]


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="hetflow bench trial_straggler", description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=30, help="runs per setting")
    p.add_argument("--pause", type=float, default=1.5, help="a paused step's factor")
    p.add_argument("--json", dest="json_path")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.seeds < 1:
        raise ConfigError(f"--seeds: must be >= 1 (got {args.seeds})")
    if args.pause < 1:
        raise ConfigError(f"--pause: must be >= 1 (got {args.pause})")
    out = {"seeds": args.seeds, "onset": ONSET, "factor": FACTOR, "pause": args.pause}
    out["settings"] = {}
    for name, speeds in SPEEDS.items():
        for fixed_s, noise in SETTINGS:
            stuck = sum(
                not moved_off(run(speeds, seed, noise, fixed_s, args.pause))
                for seed in range(args.seeds)
            )
            key = f"{name} / fixed {fixed_s:g} s / noise {noise:g}"
            out["settings"][key] = {"stuck": stuck}
            print(f"{key:40s} stuck {stuck} of {args.seeds}", flush=True)
    write_json(args.json_path, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
