"""A worker lost in place against a group restart: on one 4-worker run (digits-mlp, emulated
speeds 1, 1, 2, 4, checkpoint every 10 steps), rank 2 is killed with SIGKILL once the run has
done KILL_AT steps, under `faults.on_loss: continue` (the others regroup in place) and under
`restart` (torchrun restarts the group from the last checkpoint). Per variant: the seconds from
the kill to the next step done (`progress.json` past the step it showed at the kill, polled
every 20 ms), the steps redone, the final accuracy; and once, the same run with no kill.
Each repeat runs both variants, alternating which goes first.

    python -m benchmarks.elastic [REPEAT]
    python -m benchmarks.elastic overhead [REPEAT]   # no kill: what each step's commit costs

Figures: docs/measurements/faults.md, "A worker lost in place".
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

from hetflow.config import ClusterSpec, TrainConfig
from hetflow.infra.workspace import digits_workspace
from hetflow.records import Plan, RunResult
from hetflow.repeats import run_order
from hetflow.training.launch.run import run_workers
from hetflow.training.launch.spec import RunSpec

EVERY, STEPS, KILL_AT, KILLED = 10, 40, 15, 2


def _step(run_dir: Path) -> int:
    try:
        return json.loads((run_dir / "progress.json").read_text())["step"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return 0


def _wait(pred, limit_s: float = 240.0) -> float:
    end = time.monotonic() + limit_s
    while not pred():
        if time.monotonic() > end:
            raise TimeoutError("the run did not get there")
        time.sleep(0.02)
    return time.monotonic()


def spec_of(tmp: str, dataset, name: str, on_loss: str) -> RunSpec:
    run_dir = Path(tmp) / name
    run_dir.mkdir()
    train = TrainConfig(
        recipe="digits-mlp",
        global_batch=64,
        steps=STEPS,
        checkpoint_every=EVERY,
        eval_every=EVERY,
        faults={"on_loss": on_loss},
    )
    return RunSpec(
        run_name=name,
        variant=on_loss,
        cluster=ClusterSpec.from_speeds([1, 1, 2, 4], time_scale=2.0),
        dataset=dataset,
        train=train,
        plan=Plan.equal([8, 8, 16, 32]),
        run_dir=str(run_dir),
    )


def one(spec: RunSpec, kill: bool) -> dict:
    """The run of `spec`, rank KILLED killed at KILL_AT steps where `kill`: its figures."""
    run_dir, out = Path(spec.run_dir), {}
    thread = threading.Thread(target=lambda: out.update(raw=run_workers(spec, 600)[0]))
    thread.start()
    figures: dict = {}
    if kill:
        _wait(lambda: _step(run_dir) >= KILL_AT)
        pid = int((run_dir / "ranks" / "attempt-0" / f"rank{KILLED}.pid").read_text())
        at, t_kill = _step(run_dir), time.monotonic()
        os.kill(pid, signal.SIGKILL)
        if spec.train.faults.on_loss == "restart":  # progress.json goes back to the checkpoint
            _wait(lambda: (run_dir / "recovery.json").exists())
            at = json.loads((run_dir / "recovery.json").read_text())["resumed_at"]
        figures["kill_to_next_step_s"] = _wait(lambda: _step(run_dir) > at) - t_kill
    thread.join(timeout=600)
    result = RunResult.model_validate(out["raw"])
    lead = next(r for r in result.ranks if r.rank == 0)
    steps = [rec.step for rec in lead.records]
    figures["steps_redone"] = max(lead.recovery.steps_redone, len(steps) - len(set(steps)))
    figures["final_accuracy"] = lead.evals[-1].accuracy
    figures["membership"] = [c.model_dump() for c in lead.recovery.membership]
    timed = [rec.step_s for rec in lead.records[5:]]  # past the first steps' one-off costs
    figures["median_step_s"] = statistics.median(timed)
    return figures


def overhead(repeat: int) -> None:
    """What `continue` costs a run nothing goes wrong in (each step's commit through the
    store, the leave key read at each boundary): rank 0's median step, both variants with no
    kill, alternating which goes first; the ratio of the medians over the repeats."""
    steps: dict[str, list[float]] = {"continue": [], "restart": []}
    with digits_workspace("elastic-overhead") as (tmp, dataset):
        for i in range(repeat):
            for variant in run_order(["continue", "restart"], i):
                f = one(spec_of(tmp, dataset, f"{variant}{i}", variant), kill=False)
                steps[variant].append(f["median_step_s"])
                print(f"{variant}: median step {f['median_step_s'] * 1e3:.1f} ms", flush=True)
    c, r = (statistics.median(steps[v]) for v in ("continue", "restart"))
    print(
        f"no kill, median step continue / restart: {c / r:.3f} ({c * 1e3:.1f} / {r * 1e3:.1f} ms)"
    )


def main(repeat: int = 3) -> None:
    rows: dict[str, list[dict]] = {"continue": [], "restart": []}
    with digits_workspace("elastic") as (tmp, dataset):
        base = one(spec_of(tmp, dataset, "none", "continue"), kill=False)
        print(f"no kill: final accuracy {base['final_accuracy']:.4f}", flush=True)
        for i in range(repeat):
            for variant in run_order(["continue", "restart"], i):
                f = one(spec_of(tmp, dataset, f"{variant}{i}", variant), kill=True)
                rows[variant].append(f)
                print(
                    f"{variant}: kill to next step {f['kill_to_next_step_s']:.2f} s, "
                    f"{f['steps_redone']} steps redone, final accuracy "
                    f"{f['final_accuracy']:.4f} {f['membership']}",
                    flush=True,
                )
    for variant, fs in rows.items():
        times = [f["kill_to_next_step_s"] for f in fs]
        print(
            f"{variant}: median kill to next step {statistics.median(times):.2f} s "
            f"({', '.join(f'{t:.2f}' for t in times)}); steps redone "
            f"{[f['steps_redone'] for f in fs]}; final accuracy "
            f"{[round(f['final_accuracy'], 4) for f in fs]}"
        )
    c, r = (statistics.median(f["kill_to_next_step_s"] for f in rows[v]) for v in rows)
    print(f"continue / restart, kill to next step: {c / r:.3f}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["overhead"]:
        overhead(int(sys.argv[2]) if len(sys.argv) > 2 else 3)
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
