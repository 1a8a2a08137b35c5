"""What a lost worker costs a run: seconds from a SIGKILL of one worker to the first step done
after torchrun restarts the group from its last checkpoint, and the steps redone (4 emulated
ranks, checkpoint every 10 steps, the kill at a random step past the first checkpoint). The
defaults of `hetflow recommend --market spot` (`SPOT_RESTART_S`) come from here.

    python -m benchmarks.restart [REPEAT]

Figures: docs/measurements/faults.md, "A lost worker's restart".
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

import psutil

from hetflow.config import ClusterSpec, TrainConfig
from hetflow.infra.workspace import digits_workspace
from hetflow.records import Plan
from hetflow.training.launch.run import run_workers
from hetflow.training.launch.spec import RunSpec

EVERY, STEPS = 10, 60


def _read(path: Path, key: str) -> int | None:
    try:
        return json.loads(path.read_text())[key]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return None


def _wait(pred, limit_s: float = 240.0, poll_s: float = 0.02) -> float:
    """Poll until `pred()` holds; the time it did."""
    end = time.monotonic() + limit_s
    while not pred():
        if time.monotonic() > end:
            raise TimeoutError("the run did not get there")
        time.sleep(poll_s)
    return time.monotonic()


def _kill_a_worker(job: Path) -> None:
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or ())
        if "hetflow.training.worker" in cmd and str(job) in cmd and "distributed.run" not in cmd:
            os.kill(proc.info["pid"], signal.SIGKILL)
            return
    raise RuntimeError("no worker to kill")


def one(tmp: str, dataset, i: int, kill_at: int) -> tuple[float, float, int]:
    """(launch to first step s, kill to first step after the restart s, steps redone)."""
    run_dir = Path(tmp) / f"r{i}"
    run_dir.mkdir()
    spec = RunSpec(
        run_name=f"r{i}",
        variant="restart",
        cluster=ClusterSpec.from_speeds([1, 1, 2, 4], time_scale=2.0),
        dataset=dataset,
        train=TrainConfig(
            recipe="digits-mlp", global_batch=64, steps=STEPS, checkpoint_every=EVERY
        ),
        plan=Plan.equal([16] * 4),
        run_dir=str(run_dir),
    )
    progress, recovery = run_dir / "progress.json", run_dir / "recovery.json"
    thread = threading.Thread(target=run_workers, args=(spec,), kwargs={"timeout_s": 300})
    t0 = time.monotonic()
    thread.start()
    first = _wait(lambda: (_read(progress, "step") or 0) >= 1) - t0
    t_kill = _wait(lambda: (_read(progress, "step") or 0) >= kill_at)
    _kill_a_worker(run_dir / "job.json")
    _wait(recovery.exists)
    resumed = _read(progress, "step")
    back = _wait(lambda: (_read(progress, "step") or 0) > resumed) - t_kill
    thread.join(timeout=300)
    return first, back, _read(recovery, "steps_redone") or 0


def main(repeat: int = 3) -> None:
    rng = random.Random(0)
    with digits_workspace("restart") as (tmp, dataset):
        for i in range(repeat):
            first, back, redone = one(tmp, dataset, i, rng.randint(EVERY + 1, 3 * EVERY))
            print(
                f"launch to first step {first:.1f} s; kill to first step after the restart "
                f"{back:.1f} s; {redone} steps redone (checkpoint every {EVERY})",
                flush=True,
            )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
