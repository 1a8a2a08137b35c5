"""How a job of the queue ends other than done, and where a user reads it.

A job fails alone: whatever its model, profile or segment raised becomes its one-line reason
(`reason_of`), its MLflow run (the one its segments wrote to, else one made under the
session's run) ends FAILED with the reason as a tag, and the session goes on with the others.
A job is cancelled by `hetflow queue cancel NAME`, which leaves a request in the queue's
`cancel/` folder (`hetflow.config.queue.CANCEL_FOLDER`) that the session takes each tick
(`take_cancel_requests`); its MLflow run, where it has one, ends KILLED. What `hetflow queue
list` reads of every job, ended or not: `state_rows`.
"""

from __future__ import annotations

from pathlib import Path

from hetflow.config import ClusterSpec, ConfigError, DatasetSpec, TrackingConfig
from hetflow.config.queue import QueueJob
from hetflow.infra.tracking.tracker import MLflowTracker
from hetflow.queue.jobs import QueueError
from hetflow.training.launch.outcome import LaunchError

REASON_CHARS = 300  # a reason is one line of a table: its head, the log holds the rest
# Errors whose first line already says what and where (the field, or the rank, step and
# exception): the type's name would add nothing.
SELF_SAID = (ConfigError, QueueError, LaunchError)
# The MLflow status of a job's run by how the job ended.
RUN_STATUS = {"failed": "FAILED", "cancelled": "KILLED"}


def reason_of(e: BaseException) -> str:
    """`e` in one line: its message's first line (a rank's failure names the rank, step and
    exception there; its traceback is in the run's log), led by its type unless it is one of
    hetflow's errors that name the field or the rank themselves.

    >>> reason_of(ValueError("bad shape\\n  File ..."))
    'ValueError: bad shape'
    >>> reason_of(ConfigError("train.recipe: 'x:Y' does not import"))
    "train.recipe: 'x:Y' does not import"
    """
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    first = lines[0] if lines else ""
    if not isinstance(e, SELF_SAID) or not first:
        first = f"{type(e).__name__}: {first}".rstrip(": ")
    return first[:REASON_CHARS]


def record_end(
    job: QueueJob,
    state: str,
    reason: str,
    run_dir: Path,
    tracking: TrackingConfig,
    where: tuple[ClusterSpec, DatasetSpec, str],
) -> str | None:
    """`job`'s MLflow run ended as `state` ('failed': FAILED, 'cancelled': KILLED) with tags
    `queue_state` and `queue_reason`: the run its segments opened (`run_dir/mlflow_run_id`),
    else, for a failure, a new run named after the job under the session's run (`where`: the
    cluster, the dataset and that run's id). Returns the run's id; None for a job cancelled
    before it had a run."""
    marker = run_dir / "mlflow_run_id"
    tags = {"queue_state": state, "queue_reason": reason}
    if not marker.exists() and state != "failed":
        return None
    tracker = MLflowTracker(tracking)
    if marker.exists():
        run_id = marker.read_text().strip()
        for key, value in tags.items():
            tracker.client.set_tag(run_id, key, value)
        tracker.client.set_terminated(run_id, status=RUN_STATUS[state])
        return run_id
    cluster, dataset, parent = where
    run_id = tracker.start_run(job.name, cluster, dataset, parent, job.recipe)
    tracker.fail(run_id, reason, tags)
    return run_id


def take_cancel_requests(folder: Path | None) -> list[str]:
    """The names `hetflow queue cancel` asked for since the last call, each request removed
    once read; none where `folder` is None or holds none."""
    if folder is None or not folder.is_dir():
        return []
    names = []
    for path in sorted(folder.iterdir()):
        path.unlink(missing_ok=True)
        names.append(path.name)
    return names


def state_rows(jobs: list, pending: list[QueueJob]) -> list[dict]:
    """What `hetflow queue list` reads of a session: a row per job in it (`jobs`, the
    session's `Live`s) and per job not arrived yet (`pending`)."""
    rows = [
        {
            "name": j.job.name,
            "priority": j.job.priority,
            "state": j.state,
            "workers": j.workers,
            "steps_done": j.done,
            "steps": j.job.steps,
            "arrived_s": round(j.arrived_s, 1),  # after the session started
            "reason": j.reason,
        }
        for j in jobs
    ]
    rows += [
        {
            "name": q.name,
            "priority": q.priority,
            "state": "queued",
            "workers": [],
            "steps_done": 0,
            "steps": q.steps,
            "arrived_s": None,  # arrives `arrive_after_s` after the session started
            "reason": "",
        }
        for q in pending
    ]
    return rows
