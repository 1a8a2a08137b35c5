"""Several jobs on one mixed cluster: first-in-first-out blind to the device type, the
allocator without preemption, and the allocator with preemption at checkpoints.

    hetflow bench queue [--restart-s 20] [--interval-scale 2] [--sweep] [--json PATH]
    hetflow bench queue --real [--repeats 3] [--real-steps 160] [--time-scale 20]
        [--real-case three|queued] [--real-relaunch] [--real-measure-first]
        [--real-equal-prior]
    hetflow bench queue --move [--repeats 3]
    hetflow bench queue --pool [--repeats 3]

The comparison is an event-driven replay (`hetflow.queue.replay`) of six jobs arriving over
twenty minutes, two priority classes, on six emulated workers of three kinds (t4, v100,
a100), each job's step time per kind a line `fixed + per-sample x batch` whose per-sample
term is the job's published-style speed-up on that kind (`JOBS`: a small CNN gains little
from an a100, a transformer much). Every start and restart holds its workers idle for
`--restart-s` (launch, checkpoint load, warm-up; `--real` measures it); under preemption the
jobs below the highest class run in segments of one checkpoint interval, each a launch.

The transformer's speed-ups are set, not measured: `--sweep` replays the same arrivals with
them raised to several powers (none, the presets' ResNet-50 order, as set, beyond) and says
how the ratios to FIFO move.

`--real` also runs the queue flow itself, FIFO (`hetflow queue run --policy fifo`) against
the allocator on the same arrivals, `--repeats` rounds with the order alternated
(`benchmarks.queue_real`). `--move` measures a move in place alone, on real processes: an
elastic job lets a worker go at a step and takes it back at another (`benchmarks.queue_move`),
`--repeats` times. `--pool` measures what the session's warm pool saves a job's launch
(`benchmarks.queue_pool`), `--repeats` rounds with and without it.
"""

from __future__ import annotations

import argparse
import json
import sys

from hetflow.cli.args import Parser
from hetflow.config import ConfigError
from hetflow.queue.allocate import step_s
from hetflow.queue.jobs import Job, Kind, Line
from hetflow.queue.replay import POLICIES, Arrival, Outcome, replay

KINDS = {
    "t4": Kind("t4", 16, 25.0),
    "v100": Kind("v100", 32, 25.0),
    "a100": Kind("a100", 80, 25.0),
}
WORKERS = {"w0": "a100", "w1": "a100", "w2": "v100", "w3": "v100", "w4": "t4", "w5": "t4"}
# Per-sample speed-up over a t4 on (t4, v100, a100): a small CNN is bound by its fixed cost
# and gains little; ResNet-50 as the presets' published latencies at batch 256 give it
# (emulation/presets.py); a transformer gains most from tensor cores.
SPEEDUPS = {"digits": (1, 1.2, 1.4), "resnet": (1, 1.96, 3.93), "gpt": (1, 3.0, 8.0)}
# name, class, model, arrival (s), steps, global batch, fixed (s), per sample on a t4 (s),
# memory a worker (GB), gradient (MB), checkpoint interval (steps), workers FIFO gives it
JOBS = (
    ("digits-1", "normal", "digits", 0, 20000, 256, 0.02, 0.0004, 2, 0.5, 2000, 2),
    ("gpt-1", "normal", "gpt", 120, 3000, 64, 0.03, 0.02, 12, 50, 300, 2),
    ("resnet-1", "normal", "resnet", 240, 4000, 128, 0.03, 0.006, 8, 45, 400, 2),
    ("gpt-high", "high", "gpt", 600, 2000, 64, 0.03, 0.02, 12, 50, 300, 2),
    ("digits-2", "normal", "digits", 900, 20000, 256, 0.02, 0.0004, 2, 0.5, 2000, 2),
    ("resnet-2", "normal", "resnet", 1200, 4000, 128, 0.03, 0.006, 8, 45, 400, 2),
)


def arrivals(interval_scale: float = 1.0, gpt_power: float = 1.0) -> list[Arrival]:
    """The six jobs above, each checkpoint interval times `interval_scale`, the transformer's
    speed-ups raised to `gpt_power` (0: none, 1: as set in SPEEDUPS)."""
    out = []
    for name, cls, model, at, steps, batch, fixed, per, mem, grad, every, req in JOBS:
        ups = SPEEDUPS[model] if model != "gpt" else gpt_speedups(gpt_power)
        speedups = zip(("t4", "v100", "a100"), ups, strict=True)
        lines = {k: Line(fixed, per / s) for k, s in speedups}
        every = max(1, round(every * interval_scale))
        job = Job(name, cls, batch, steps, mem, lines, grad, every)
        out.append(Arrival(job, float(at), req))
    return out


def gpt_speedups(power: float) -> tuple[float, ...]:
    """The transformer's speed-ups on (t4, v100, a100) raised to `power`: their ratio kept in
    log space, their size scaled (0.5: (1, 1.73, 2.83); 1: as set)."""
    return tuple(round(s**power, 3) for s in SPEEDUPS["gpt"])


def interval_at(o: Outcome, jobs: list[Arrival], t: float) -> float:
    """The longest checkpoint interval (s) among the jobs holding workers at `t`: each one's
    `checkpoint_every` steps at its step time on the workers it held then."""
    by_name = {a.job.name: a.job for a in jobs}
    held: dict[str, list[str]] = {}
    for job, worker, a, b in o.spans:
        if a <= t < b:
            held.setdefault(job, []).append(worker)
    return max(
        (
            by_name[j].checkpoint_every * step_s(by_name[j], [KINDS[WORKERS[w]] for w in ws])
            for j, ws in held.items()
        ),
        default=0.0,
    )


def row(o: Outcome, jobs: list[Arrival], high: Arrival) -> dict:
    return {
        "policy": o.policy,
        "avg_jct_s": round(o.avg_jct_s, 1),
        "makespan_s": round(o.makespan_s, 1),
        "high_wait_s": round(o.wait_s[high.job.name], 1),
        "interval_at_high_s": round(interval_at(o, jobs, high.at_s), 1),
        "restarts": o.restarts,
        "restart_cost_s": round(o.restart_s, 1),
        "steps_redone": o.redone_steps,
        "jct_s": {k: round(v, 1) for k, v in o.jct_s.items()},
    }


def compare(restart_s: float, interval_scale: float, gpt_power: float = 1.0) -> list[dict]:
    """One replay per policy of the same arrivals, each row with its ratio to FIFO's."""
    jobs = arrivals(interval_scale, gpt_power)
    high = next(a for a in jobs if a.job.priority == "high")
    rows = [row(replay(jobs, WORKERS, KINDS, p, restart_s), jobs, high) for p in POLICIES]
    for r in rows:
        r["avg_jct_vs_fifo"] = round(r["avg_jct_s"] / rows[0]["avg_jct_s"], 3)
        r["makespan_vs_fifo"] = round(r["makespan_s"] / rows[0]["makespan_s"], 3)
    return rows


# The powers `--sweep` raises the transformer's speed-ups to: none, the presets' ResNet-50's
# order (about 0.66), as set, and beyond.
SWEEP_POWERS = (0.0, 0.25, 0.5, 0.66, 0.75, 1.0, 1.25)


def sweep(restart_s: float, interval_scale: float) -> list[dict]:
    """How the replay's ratios to FIFO move with the transformer's assumed speed-ups: one
    row per power of `SWEEP_POWERS`."""
    out = []
    for power in SWEEP_POWERS:
        rows = {r["policy"]: r for r in compare(restart_s, interval_scale, power)}
        out.append(
            {
                "gpt_power": power,
                "gpt_speedups": gpt_speedups(power),
                "packed_vs_fifo": rows["packed"]["avg_jct_vs_fifo"],
                "preempt_vs_fifo": rows["preempt"]["avg_jct_vs_fifo"],
                "fifo_avg_jct_s": rows["fifo"]["avg_jct_s"],
                "preempt_high_wait_s": rows["preempt"]["high_wait_s"],
                "fifo_high_wait_s": rows["fifo"]["high_wait_s"],
            }
        )
    return out


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="hetflow bench queue", description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--restart-s", type=float, default=20.0, help="each start's cost (s)")
    p.add_argument("--interval-scale", type=float, default=1.0, help="checkpoint intervals x")
    p.add_argument("--sweep", action="store_true", help="also the transformer speed-up sweep")
    p.add_argument("--real", action="store_true", help="also the queue flow: fifo vs allocator")
    p.add_argument("--move", action="store_true", help="also a move in place's cost, alone")
    p.add_argument(
        "--pool", action="store_true", help="also a launch with the warm pool and without"
    )
    p.add_argument("--repeats", type=int, default=3, help="rounds (--real: of both policies)")
    p.add_argument("--time-scale", type=float, default=20.0, help="--real's emulation scale")
    p.add_argument("--real-speeds", default="t4,v100,a100", help="--real's workers (presets)")
    p.add_argument("--real-steps", type=int, default=160, help="--real's low and normal jobs")
    p.add_argument("--real-case", default="three", help="--real's jobs: three, or queued (5)")
    p.add_argument(
        "--real-measure-first",
        action="store_true",
        help="--real: also the allocator profiling each job first, a third variant",
    )
    p.add_argument(
        "--real-equal-prior",
        action="store_true",
        help="--real: also the allocator placing from the equal split, not the presets' ratios",
    )
    p.add_argument(
        "--real-relaunch", action="store_true", help="--real's jobs not elastic: moves relaunch"
    )
    p.add_argument("--json", help="also write the figures to this file")
    return p


def check(args: argparse.Namespace) -> None:
    """Each bad flag refused in one line naming it, before anything runs."""
    if args.restart_s < 0:
        raise ConfigError(f"--restart-s: a start's cost is at least 0 s (got {args.restart_s:g})")
    if args.interval_scale <= 0:
        raise ConfigError(f"--interval-scale: above 0 (got {args.interval_scale:g})")
    if args.repeats < 1:
        raise ConfigError(f"--repeats: at least 1 (got {args.repeats})")
    if args.real_steps < 2:
        raise ConfigError(f"--real-steps: at least 2, high runs half (got {args.real_steps})")
    if args.time_scale <= 0:
        raise ConfigError(f"--time-scale: above 0 (got {args.time_scale:g})")
    from hetflow.emulation.presets import PRESETS

    from benchmarks.queue_real import CASES

    if args.real_case not in CASES:
        raise ConfigError(f"--real-case: one of {', '.join(CASES)} (got {args.real_case!r})")

    bad = [s for s in args.real_speeds.split(",") if s not in PRESETS]
    if bad:
        raise ConfigError(f"--real-speeds: not a preset: {bad[0]!r}; one of {', '.join(PRESETS)}")


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    check(args)
    out: dict = {"replay": compare(args.restart_s, args.interval_scale)}
    for r in out["replay"]:
        print({k: v for k, v in r.items() if k != "jct_s"})
    if args.sweep:
        out["sweep"] = sweep(args.restart_s, args.interval_scale)
        for r in out["sweep"]:
            print(r)
    if args.real:
        from benchmarks.queue_real import compare_real

        out["real"] = compare_real(
            args.real_speeds,
            args.time_scale,
            args.real_steps,
            args.restart_s,
            args.repeats,
            args.real_case,
            not args.real_relaunch,
            args.real_measure_first,
            args.real_equal_prior,
        )
        print(json.dumps(out["real"]["aggregate"], indent=1))
    if args.move:
        from benchmarks.queue_move import measure_moves

        out["move"] = measure_moves(args.repeats)
        print(json.dumps(out["move"]["median"], indent=1))
    if args.pool:
        from benchmarks.queue_pool import measure_pool

        out["pool"] = measure_pool(args.repeats)
        print(json.dumps(out["pool"]["median"], indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
