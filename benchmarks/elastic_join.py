"""A worker joining a running job in place: one 4-worker run (digits-mlp, emulated speeds 1, 1,
2, 4) whose fastest worker, rank 3, starts late (`faults.join_at`: a warm worker assigned once
the job has done JOIN_AT steps, which then joins in place), against the same run with all four
from the start. Per join run: the steps from the joiner's being ready (it asks) to its being
in the plan, the join's seconds by phase (the joiner's and the leader's figures; beside them
a cold rank's start, that of the ranks that start the job, which a warm worker saves), and the
run's throughput from SETTLE steps after the join to the end, against the four-from-start
run's over the same steps (global batch x steps / the leader's summed step times). Each repeat
runs both, alternating which goes first; the figures are the median of the repeats with their
min-max.

    python -m benchmarks.elastic_join [REPEAT]

Figures: docs/measurements/faults.md, "A worker joining in place".
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from hetflow.config import ClusterSpec, TrainConfig
from hetflow.infra.workspace import digits_workspace
from hetflow.records import Plan, RunResult
from hetflow.repeats import run_order
from hetflow.training.launch.run import run_workers
from hetflow.training.launch.spec import RunSpec

STEPS, JOIN_AT, LATE, SETTLE, GLOBAL, SCALE = 60, 5, 3, 10, 64, 20.0


def spec_of(tmp: str, dataset, name: str, join: bool) -> RunSpec:
    run_dir = Path(tmp) / name
    run_dir.mkdir()
    faults = {"on_loss": "continue", "join_at": {LATE: JOIN_AT} if join else {}}
    train = TrainConfig(
        recipe="digits-mlp",
        global_batch=GLOBAL,
        steps=STEPS,
        checkpoint_every=20,
        eval_every=20,
        faults=faults,
    )
    return RunSpec(
        run_name=name,
        variant="join" if join else "four",
        cluster=ClusterSpec.from_speeds([1, 1, 2, 4], time_scale=SCALE),
        dataset=dataset,
        train=train,
        plan=Plan.equal([GLOBAL // 4] * 4),
        run_dir=str(run_dir),
    )


def throughput(result: RunResult, first: int) -> float:
    """Samples per second of the leader's steps from `first` to the end."""
    lead = result.lead
    steps = [rec for rec in lead.records if rec.step >= first]
    return GLOBAL * len(steps) / sum(rec.step_s for rec in steps)


def join_figures(result: RunResult) -> dict:
    """The join's step, its steps from ready to the plan, its seconds by phase."""
    joiner = next(r for r in result.ranks if r.rank == LATE)
    (change,) = [c for c in joiner.recovery.membership if LATE in c.joined]
    lead = next(c for c in result.lead.recovery.membership if LATE in c.joined)
    phases = {k: v for k, v in change.join_s.items() if k != "ready_step"}
    phases |= {f"leader_{k}": v for k, v in lead.join_s.items()}
    cold = [r.timeline.startup for r in result.ranks if r.rank != LATE and r.timeline.startup]
    return {
        "cold_start_s": statistics.median(
            s.import_s + s.rendezvous_s + s.data_s + s.model_s for s in cold
        ),
        "at": change.step,
        "steps_to_plan": change.step - int(change.join_s["ready_step"]),
        "phases": phases,
        "share": change.plan[LATE],
    }


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"


def main(repeat: int = 3) -> None:
    rows: list[dict] = []
    with digits_workspace("elastic-join") as (tmp, dataset):
        for i in range(repeat):
            got: dict = {}
            for variant in run_order(["join", "four"], i):
                spec = spec_of(tmp, dataset, f"{variant}{i}", variant == "join")
                got[variant] = RunResult.model_validate(run_workers(spec, 900)[0])
            f = join_figures(got["join"])
            first = f["at"] + SETTLE
            f["ratio"] = throughput(got["join"], first) / throughput(got["four"], first)
            rows.append(f)
            print(
                f"repeat {i}: joined at step {f['at']}, {f['steps_to_plan']} step(s) from "
                f"ready to the plan, share {f['share']}; throughput from step {first} "
                f"join / four {f['ratio']:.3f}; phases (s) {f['phases']}",
                flush=True,
            )
    print(f"steps from ready to the plan: {[f['steps_to_plan'] for f in rows]}")
    print(f"throughput after the join / four from the start: {spread([f['ratio'] for f in rows])}")
    print(
        "a cold rank's start in the same runs (import, rendezvous, data, model; the ranks "
        f"that start the job): {spread([f['cold_start_s'] for f in rows])} s"
    )
    for k in rows[0]["phases"]:
        print(f"  {k}: {spread([f['phases'].get(k, 0.0) for f in rows])} s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
