"""`hetflow bench learner`: the learner on emulated devices, step by step, with no host (pure).

    hetflow bench learner                         # every mix, both noise levels, 6 seeds
    hetflow bench learner --seeds 20 --json learner.json

The training loop's own turn (`loop.rebalancing.rebalance` and its `LoopState`) is fed each
step's compute times by `emulation.device_model.EmulatedCluster`: devices of their own
published curves (presets, and speed-only devices of the presets' shapes: `curve`
'published'), noise `alone`
or `shared` (slow stretches of several steps, pauses), stragglers that jump or drift in. A
run starts from the equal split. A plan is graded by what its steps cost under that noise
(`paid`: the mean over many steps of the slowest rank's time, on another seed), against the
best plan of the noise-free curves (`best_plan`, each worker kept or left out), never against
the learner's own model. In seconds, so that a change of the learner is measured over many
seeds before a run on real workers (`hetflow bench hetero`) says the rest.
"""

from __future__ import annotations

import argparse
import statistics
from typing import NamedTuple

from hetflow.cli.args import Parser
from hetflow.config import ConfigError, TrainConfig
from hetflow.emulation.device_model import NOISE_LEVELS, Device, EmulatedCluster
from hetflow.perf.balance import fill
from hetflow.training.loop.rebalancing import rebalance
from hetflow.training.loop.state import LoopState
from hetflow.training.plan.rebalancer import Rebalancer

from benchmarks import write_json

B, STEPS = 128, 150
MIXES = {
    "t4,t4,v100,a100": [Device(preset=p) for p in ("t4", "t4", "v100", "a100")],
    "a100 beside 3 t4": [Device(preset=p) for p in ("t4", "t4", "t4", "a100")],
    "1,1,2,4": [Device(speed=s, curve="published") for s in (1, 1, 2, 4)],
    "1,2,3,4,6": [Device(speed=s, curve="published") for s in (1, 2, 3, 4, 6)],
    "1,1,2,3,5,8": [Device(speed=s, curve="published") for s in (1, 1, 2, 3, 5, 8)],
}
STRAGGLERS = {"jump": (3, 60, 4.0, 0), "drift": (3, 60, 4.0, 20)}  # on 1,1,2,4


class Run(NamedTuple):
    """A driven run: the loop's state, its re-balancer, and what its steps cost (`paid_s`: the
    sum over its steps of the slowest rank's time)."""

    state: LoopState
    rebalancer: Rebalancer
    paid_s: float


def run(devices, noise: str, seed: int, stragglers=(), steps: int = STEPS) -> Run:
    """A dynamic run from the equal split: every step's compute times into the loop's state and
    its re-balancer's turn, as the training loop takes it."""
    n = len(devices)
    cfg = TrainConfig(recipe="digits-cnn", schedule="dynamic", steps=steps, global_batch=B)
    cluster = EmulatedCluster(devices, NOISE_LEVELS[noise], seed=seed, stragglers=stragglers)
    reb = Rebalancer(B, [None] * n, [0.0] * n, [1e-3] * n, threshold=cfg.rebalance_threshold)
    state = LoopState.fresh(fill([lambda b: b] * n, B, [B] * n))
    paid_s = 0.0
    for step in range(steps):
        row = cluster.step_times(state.plan, step)
        paid_s += max(row)
        state.add_row(len(state.plans), step, row)
        rebalance(reb, state, cfg, step, flush=False, last=step == steps - 1)
    return Run(state, reb, paid_s)


def paid(devices, plan, noise: str, stragglers=(), at: int = 0, steps: int = 600) -> float:
    """What `plan`'s steps cost under `noise` from step `at` on: the mean over `steps` steps of
    the slowest rank's time (another seed than the runs')."""
    cluster = EmulatedCluster(devices, NOISE_LEVELS[noise], seed=999, stragglers=stragglers)
    return sum(max(cluster.step_times(plan, at + s)) for s in range(steps)) / steps


def best_plan(devices, factors=None) -> list[int]:
    """The plan of least noise-free step, each worker kept or left out (exhaustive)."""
    factors = factors or [1.0] * len(devices)
    n, best = len(devices), None
    for mask in range(1, 2**n):
        keep = [i for i in range(n) if mask >> i & 1]
        costs = [lambda b, i=i: devices[i].compute_s(b) * factors[i] for i in keep]
        plan = [0] * n
        for i, b in zip(keep, fill(costs, B, [B] * len(keep)), strict=True):
            plan[i] = b
        step = max(devices[i].compute_s(b) * factors[i] for i, b in enumerate(plan) if b)
        if best is None or step < best[0]:
            best = (step, plan)
    return best[1]


def mix_figures(devices, noise: str, seeds: int) -> dict:
    """Over `seeds` runs: the final plan's cost over the best plan's (median, max), the start's
    over the final's (min: below 1, the run ended worse than it started), plan changes after
    step 30 (max), and what the whole run's steps cost over the best plan's (median: learning
    and every change included)."""
    best = paid(devices, best_plan(devices), noise)
    finals, gains, late, whole = [], [], [], []
    for seed in range(seeds):
        state, _, paid_s = run(devices, noise, seed)
        final = paid(devices, state.plan, noise)
        finals.append(final / best)
        whole.append(paid_s / (STEPS * best))
        gains.append(paid(devices, state.plans[0].plan, noise) / final)
        late.append(sum(p.step > 30 for p in state.plans[1:]))
    return {
        "final_over_best_median": statistics.median(finals),
        "final_over_best_max": max(finals),
        "start_over_final_min": min(gains),
        "changes_after_30_max": max(late),
        "run_over_best_median": statistics.median(whole),
    }


def straggler_figures(kind: str, noise: str, seeds: int) -> dict:
    """A straggler on 1,1,2,4 (rank 3 4x slower from step 60, at once or over 20 steps): the
    steps from its full factor to the first plan off it (max), the re-plans after its onset
    (max; returns to a plan measured before not counted), the plan at step 150 over the best
    plan for the slowed devices (max)."""
    devices, straggler = MIXES["1,1,2,4"], STRAGGLERS[kind]
    full = straggler[1] + straggler[3]
    slowed = paid(devices, best_plan(devices, [1, 1, 1, 4.0]), noise, [straggler], 100)
    reacts, replans, finals = [], [], []
    for seed in range(seeds):
        state, reb, _ = run(devices, noise, seed, stragglers=[straggler])
        after = [p.step for p in state.plans[1:] if p.step > straggler[1]]
        reacts.append(after[0] - full if after else None)
        replans.append(sum(h["step"] > straggler[1] and "reverted" not in h for h in reb.history))
        finals.append(paid(devices, state.plan, noise, [straggler], 100) / slowed)
    return {
        "steps_to_move_off_max": None if None in reacts else max(reacts),
        "replans_after_onset_max": max(replans),
        "final_over_best_max": max(finals),
    }


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="hetflow bench learner", description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=6, help="runs per mix and noise level")
    p.add_argument("--json", dest="json_path")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.seeds < 1:
        raise ConfigError(f"--seeds: must be >= 1 (got {args.seeds})")
    out = {"seeds": args.seeds, "steps": STEPS, "global_batch": B, "mixes": {}, "stragglers": {}}
    for name, devices in MIXES.items():
        for noise in ("alone", "shared"):
            f = out["mixes"][f"{name} / {noise}"] = mix_figures(devices, noise, args.seeds)
            print(
                f"{name:18s} {noise:6s} final/best median {f['final_over_best_median']:.2f} "
                f"max {f['final_over_best_max']:.2f}, start/final min "
                f"{f['start_over_final_min']:.2f}, changes after step 30 max "
                f"{f['changes_after_30_max']}, whole run/best median "
                f"{f['run_over_best_median']:.2f}",
                flush=True,
            )
    for kind in STRAGGLERS:
        for noise in ("alone", "shared"):
            f = out["stragglers"][f"{kind} / {noise}"] = straggler_figures(kind, noise, args.seeds)
            print(
                f"straggler {kind:5s} {noise:6s} moved off {f['steps_to_move_off_max']} steps "
                f"after its full factor (max), re-plans after onset max "
                f"{f['replans_after_onset_max']}, final/best max {f['final_over_best_max']:.2f}",
                flush=True,
            )
    write_json(args.json_path, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
