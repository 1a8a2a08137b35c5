"""Several jobs on one mixed cluster: first-in-first-out blind to the device type, the
allocator without preemption, and the allocator with preemption at checkpoints.

    hetflow bench queue [--restart-s 20] [--interval-scale 2] [--json PATH] [--real]

The comparison is an event-driven replay (`hetflow.queue.replay`) of six jobs arriving over
twenty minutes, two priority classes, on six emulated workers of three kinds (t4, v100,
a100), each job's step time per kind a line `fixed + per-sample x batch` whose per-sample
term is the job's published-style speed-up on that kind (`JOBS`: a small CNN gains little
from an a100, a transformer much). Every start and restart holds its workers idle for
`--restart-s` (launch, checkpoint load, warm-up; `--real` measures it); under preemption the
jobs below the highest class run in segments of one checkpoint interval, each a launch.

`--real` also runs the queue itself (the `queue` flow, three digits jobs of three classes,
the highest arriving while the cluster is full) on a small emulated cluster of three kinds
(`--real-speeds`) and reports what it measured: each job's wait and completion, steps
redone, and what its launches cost beyond training.
"""

from __future__ import annotations

import argparse
import json

from hetflow.cli.parser import Parser
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


def arrivals(interval_scale: float = 1.0) -> list[Arrival]:
    """The six jobs above, each checkpoint interval times `interval_scale`."""
    out = []
    for name, cls, model, at, steps, batch, fixed, per, mem, grad, every, req in JOBS:
        speedups = zip(("t4", "v100", "a100"), SPEEDUPS[model], strict=True)
        lines = {k: Line(fixed, per / s) for k, s in speedups}
        every = max(1, round(every * interval_scale))
        job = Job(name, cls, batch, steps, mem, lines, grad, every)
        out.append(Arrival(job, float(at), req))
    return out


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


def compare(restart_s: float, interval_scale: float) -> list[dict]:
    """One replay per policy of the same arrivals, each row with its ratio to FIFO's."""
    jobs = arrivals(interval_scale)
    high = next(a for a in jobs if a.job.priority == "high")
    rows = [row(replay(jobs, WORKERS, KINDS, p, restart_s), jobs, high) for p in POLICIES]
    for r in rows:
        r["avg_jct_vs_fifo"] = round(r["avg_jct_s"] / rows[0]["avg_jct_s"], 3)
        r["makespan_vs_fifo"] = round(r["makespan_s"] / rows[0]["makespan_s"], 3)
    return rows


def real_jobs(steps: int) -> list:
    """Three digits jobs, one per class, the higher ones arriving later."""
    from hetflow.config.queue import QueueJob

    common = {"recipe": "digits-mlp", "global_batch": 64, "checkpoint_every": steps // 5}
    return [
        QueueJob(name="low", priority="low", steps=steps, **common),
        QueueJob(name="normal", priority="normal", steps=steps, arrive_after_s=5, **common),
        QueueJob(name="high", priority="high", steps=steps // 2, arrive_after_s=10, **common),
    ]


def real_run(speeds: str, time_scale: float, steps: int, switch_s: float) -> dict:
    """The queue flow on `real_jobs` and an emulated cluster of `speeds` (presets)."""
    from hetflow.config import ClusterSpec
    from hetflow.flows.job_queue import queue

    cluster = ClusterSpec.from_speeds(speeds.split(","), name="queue-real", time_scale=time_scale)
    out = queue(jobs=real_jobs(steps), cluster=cluster, switch_s=switch_s, read_inbox=False)
    return {k: out[k] for k in ("figures", "jobs", "spans", "parent_run_id")}


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="hetflow bench queue", description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--restart-s", type=float, default=20.0, help="each start's cost (s)")
    p.add_argument("--interval-scale", type=float, default=1.0, help="checkpoint intervals x")
    p.add_argument("--real", action="store_true", help="also run the queue flow itself")
    p.add_argument("--time-scale", type=float, default=20.0, help="--real's emulation scale")
    p.add_argument("--real-speeds", default="t4,v100,a100", help="--real's workers (presets)")
    p.add_argument("--real-steps", type=int, default=100, help="--real's low and normal jobs")
    p.add_argument("--json", help="also write the figures to this file")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.restart_s < 0:
        raise ConfigError(f"--restart-s: a start's cost is at least 0 s (got {args.restart_s:g})")
    if args.interval_scale <= 0:
        raise ConfigError(f"--interval-scale: above 0 (got {args.interval_scale:g})")
    out: dict = {"replay": compare(args.restart_s, args.interval_scale)}
    if args.real:
        out["real"] = real_run(args.real_speeds, args.time_scale, args.real_steps, args.restart_s)
    for r in out["replay"]:
        print({k: v for k, v in r.items() if k != "jct_s"})
    if args.real:
        print(json.dumps(out["real"]["figures"], indent=1))
        print(json.dumps(out["real"]["jobs"], indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0
