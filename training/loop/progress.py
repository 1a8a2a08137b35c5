"""Rank 0's record of how far a run got (progress.json), of its restarts (recovery.json), and
of what its steps measured of each worker (points.json)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hetflow.records import Recovery

# A run's stop request: the step (a checkpoint boundary) at which it ends before its last, as
# text (`TrainingLoop.stop_asked`); the queue writes it to move a job's workers.
STOP_FILE = "stop_at"
PROGRESS_FILE = "progress.json"  # `ProgressFile`, in the run directory
POINTS_FILE = "points.json"  # `write_points`, in the run directory


def write_points(run_dir: Path, step: int, points: dict[str, dict[int, float]]) -> None:
    """`{"step": N, "workers": {worker: {batch: compute seconds}}}`: each worker's points the
    re-balancer has learned (`Rebalancer.points`) after `step` steps, for the queue to learn
    each kind's line from (`hetflow.queue.pace.kind_lines`); whole, through a rename, since it
    is read while the run goes on. Written once a window, not every step."""
    tmp = run_dir / f".{POINTS_FILE}.tmp"
    workers = {w: {str(b): t for b, t in pts.items()} for w, pts in points.items()}
    tmp.write_text(json.dumps({"step": step, "workers": workers}))
    os.replace(tmp, run_dir / POINTS_FILE)


def read_points(run_dir: Path) -> tuple[int, dict[str, dict[int, float]]] | None:
    """What `write_points` wrote last in `run_dir`: (its step, each worker's points); None
    where nothing is there yet.

    >>> import tempfile; d = Path(tempfile.mkdtemp())
    >>> read_points(d) is None
    True
    >>> write_points(d, 7, {"w0": {16: 0.1, 32: 0.18}}); read_points(d)
    (7, {'w0': {16: 0.1, 32: 0.18}})
    """
    try:
        raw = json.loads((run_dir / POINTS_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return None
    workers = {w: {int(b): float(t) for b, t in p.items()} for w, p in raw["workers"].items()}
    return int(raw["step"]), workers


class ProgressFile:
    """progress.json, `{"step": N}`, rewritten in place every step with one fixed-width pwrite.

    The launcher polls it for the Prefect progress artifact and a restart reads it to count the
    steps redone. A pwrite in place, not a write to a temporary file and a rename, because it
    runs every step inside the training loop (measured: docs/measurements/loop.md). The file holds
    `start` from the moment it is opened, so a restart never finds it empty.
    """

    WIDTH = 12

    def __init__(self, path: Path, start: int):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        self.write(start)
        os.ftruncate(self.fd, len(self._record(start)))  # drops whatever an older format left

    def _record(self, step: int) -> bytes:
        return f'{{"step": {step:>{self.WIDTH}}}}\n'.encode()

    def write(self, step: int) -> None:
        os.pwrite(self.fd, self._record(step), 0)


def note_recovery(run_dir: Path, resumed_at: int) -> Recovery:
    """On a start over an earlier attempt of this run, count it and the steps done again.

    An earlier attempt is torchrun's elastic restart after a worker died, or a new launch in the
    same run directory (a Prefect retry of the train task after torchrun itself died). Rank 0
    records the last completed step every step (progress.json, local to the run directory);
    what lies between the checkpoint (`resumed_at`) and that step is done again. The counts
    accumulate in recovery.json across attempts; rank 0 alone calls this, before it opens
    progress.json for the new attempt.
    """
    path = run_dir / "recovery.json"
    note = json.loads(path.read_text()) if path.exists() else {"restarts": 0, "steps_redone": 0}
    progress = run_dir / "progress.json"
    if progress.exists():
        done = json.loads(progress.read_text())["step"]
        redone = max(0, done - resumed_at)
        note = {
            "restarts": note["restarts"] + 1,
            "steps_redone": note["steps_redone"] + redone,
            "resumed_at": resumed_at,
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(note))
        tmp.replace(path)
        how = f"torchrun restart {os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        print(f"rank 0: {how}, resuming at step {resumed_at} ({redone} steps redone)", flush=True)
    return Recovery.model_validate(note)
