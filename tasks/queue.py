"""The queue's Prefect tasks: the cluster's workers as global concurrency limits (one per
worker kind, the slots the Prefect UI shows), each job's step-time line per kind, and one
segment of a job: its train run, on the workers the queue gave it, to its next checkpoint.

Prefect's own mechanisms serve where they can: a global concurrency limit per kind holds what
the running segments occupy, and every segment is a task run of the queue's flow run. What
they lack is why the allocator exists (`hetflow.queue`): a work queue's priority orders runs
and a concurrency limit caps how many run, but neither knows a job's speed on each kind of
worker, chooses which workers a run gets, or stops a run at a checkpoint to give its workers
to another.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prefect import task
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate

from hetflow.config import ClusterSpec, DatasetSpec, TrackingConfig
from hetflow.config.queue import QueueJob, worker_memory_gb
from hetflow.history import kind_slug, worker_kind
from hetflow.queue.jobs import Job, Kind, Line
from hetflow.tasks.history import prior_or_history, profile_for, profile_or_reuse
from hetflow.tasks.queue_moves import free_slots, hold_slots
from hetflow.tasks.train import train_variant
from hetflow.training.loop.stop_channel import StopChannel, stop_channel
from hetflow.training.plan.assemble import sub_cluster
from hetflow.training.plan.prior import HISTORY, prior_kind

# How long a segment waits for its workers' slots: the queue frees them before it starts one,
# so a longer wait is a slot held by something else (a second session, a hand-made limit).
SLOT_WAIT_S = 120.0


def cluster_kinds(cluster: ClusterSpec) -> tuple[dict[str, str], dict[str, Kind]]:
    """(each worker's kind by name, in the cluster's order; each kind's `Kind`)."""
    workers = {w.name: worker_kind(cluster, i) for i, w in enumerate(cluster.workers)}
    kinds: dict[str, Kind] = {}
    for i, w in enumerate(cluster.workers):
        gbps = w.link_gbps or 10.0
        kinds.setdefault(workers[w.name], Kind(workers[w.name], worker_memory_gb(cluster, i), gbps))
    return workers, kinds


def slot_name(kind: str) -> str:
    """The global concurrency limit of the workers of `kind`."""
    return f"hetflow-workers-{kind_slug(kind)}"


@task(task_run_name="worker slots of {cluster.name}")
def ensure_slots(cluster: ClusterSpec) -> dict[str, int]:
    """One global concurrency limit per worker kind, as many slots as the cluster has of it
    (created, or resized where it exists), none occupied: the session owns the cluster, so
    slots a session that died left occupied are freed. {limit name: slots}."""
    counts = Counter(worker_kind(cluster, i) for i in range(cluster.world_size))
    slots = {slot_name(k): n for k, n in counts.items()}
    with get_client(sync_client=True) as client:
        for name, n in slots.items():
            client.upsert_global_concurrency_limit_by_name(name, n)
            client.update_global_concurrency_limit(
                name, GlobalConcurrencyLimitUpdate(limit=n, active_slots=0)
            )
    return slots


@task(task_run_name="step times of {job.name} per worker kind")
def job_model(job: QueueJob, cluster: ClusterSpec, dataset: DatasetSpec) -> tuple[Job, float]:
    """`job` as the allocator sees it, and the seconds spent measuring it: each kind's line
    from the profile history, the kinds without an entry measured on one worker each
    (`tasks.history.profile_or_reuse`; none measured when every kind is known)."""
    profile = profile_or_reuse(cluster, dataset, job.train_config())
    workers, _ = cluster_kinds(cluster)
    lines: dict[str, Line] = {}
    for r in profile.ranks:
        lines.setdefault(workers[r.worker], Line(r.fit_latency_s, r.fit_s_per_sample))
    return queue_model(job, lines), profile.profiling_time_s


def job_prior(
    job: QueueJob, cluster: ClusterSpec, dataset: DatasetSpec, published: bool = True
) -> tuple[Job, bool]:
    """`job` as the allocator sees it with nothing measured first, and whether its lines are
    a prior's, in the prior's unit (`hetflow.queue.pace`: its own steps set the unit): each
    kind's line from the profile history where every kind has an entry (seconds, no flag),
    else from the published ratios of the workers' presets (unless not `published`) or the
    equal split (`tasks.history.prior_or_history`; nothing launched)."""
    profile = prior_or_history(cluster, dataset, job.train_config(), published=published)
    workers, _ = cluster_kinds(cluster)
    lines: dict[str, Line] = {}
    for r in profile.ranks:
        lines.setdefault(workers[r.worker], Line(r.fit_latency_s, r.fit_s_per_sample))
    history = all(prior_kind(s) == HISTORY for s in profile.sources)
    return queue_model(job, lines), not history


def queue_model(job: QueueJob, lines: dict[str, Line] | None = None) -> Job:
    """`job` as the allocator sees it, with the step-time `lines` per kind (none: what the
    fifo policy sees, blind to the device type)."""
    return Job(
        name=job.name,
        priority=job.priority,
        global_batch=job.global_batch,
        steps=job.steps,
        memory_gb=job.memory_gb,
        lines=dict(lines or {}),
        checkpoint_every=job.checkpoint_every,
    )


@dataclass(frozen=True)
class Segment:
    """A segment that ran: the job, its workers, the steps it reached, its wall time, the
    part of it its training loop took (the rest: launch, plan, checkpoint load, recording),
    the steps redone so far in the job's run, and the MLflow run (one per job)."""

    job: str
    workers: tuple[str, ...]
    to_step: int
    wall_s: float
    train_s: float
    steps_redone: float
    run_id: str


@task(task_run_name="{job.name} on {names}")
def run_segment(
    job: QueueJob,
    cluster: ClusterSpec,
    names: list[str],
    dataset: DatasetSpec,
    tracking: TrackingConfig,
    parent_run_id: str,
) -> Segment:
    """`job`'s train run on the workers `names` of `cluster`, holding their kinds' slots (one
    each, `queue_moves.hold_slots`), until its end or the checkpoint a stop request names
    (`job_stop_channel`), some of its workers perhaps let go in place before, or others taken
    in place (a job that runs elastic is launched with every other worker it could take as a
    spare slot, not started: `spare_workers`, `queue_moves.Moves.grow`): it resumes
    from the job's last checkpoint (its run directory is the queue's flow run's, by job
    name; under the Ray launcher its checkpoints are in the dataset's bucket, which every
    node reaches). The segment's `to_step` is the step it reached (`reached_step`)."""
    t = time.monotonic()
    spare = spare_workers(job, cluster, names)
    order = {w.name: i for i, w in enumerate(cluster.workers)}
    indices = sorted(order[n] for n in names) + [order[n] for n in spare]  # held ones first
    sub = sub_cluster(cluster, indices).model_copy(update={"name": f"{cluster.name}/{job.name}"})
    train = job.train_config()
    if job.in_place:  # its ranks, first and joining, on the session's warm workers
        faults = train.faults.model_copy(update={"spare": spare})
        train = train.model_copy(update={"faults": faults})
    workers, _ = cluster_kinds(cluster)
    hold_slots(job.name, {n: slot_name(workers[n]) for n in names}, SLOT_WAIT_S)
    try:  # a worker that leaves in place gives its slot back then (`queue_moves.Moves`)
        profile = profile_for(sub, dataset, train, [train])
        out = train_variant(job.name, sub, dataset, train, profile, tracking, parent_run_id)
    finally:
        free_slots(job.name)
    figures = out.metrics.flat()
    wall = time.monotonic() - t
    return Segment(
        job.name,
        tuple(names),
        reached_step(out, cluster.launcher),
        wall,
        float(figures.get("train_loop_s", wall)),
        float(figures.get("steps_redone", 0.0)),
        out.run_id,
    )


def spare_workers(job: QueueJob, cluster: ClusterSpec, names: list[str]) -> list[str]:
    """The workers of `cluster` a segment of `job` on `names` launches as spare slots
    (`faults.spare`: not started, joinable in place when the queue grows the job onto them,
    `queue_moves.Moves.grow`): for a job that runs elastic (`QueueJob.in_place`), every
    other worker that holds it (its memory), in the cluster's order; else none."""
    if not job.in_place:
        return []
    return [
        w.name
        for i, w in enumerate(cluster.workers)
        if w.name not in names and worker_memory_gb(cluster, i) >= job.memory_gb
    ]


def reached_step(out, launcher: str) -> int:
    """The steps a segment's run (`TrainOutcome`) reached: rank 0's progress.json in its run
    directory on the local launcher; on Ray, whose rank 0 may run on another node, the step
    after its last step record (the file where it recorded none)."""
    records = out.result.lead.records if launcher == "ray" else []
    if records:
        return max(r.step for r in records) + 1
    return json.loads((Path(out.run_dir) / "progress.json").read_text())["step"]


def job_stop_channel(cluster: ClusterSpec, run_dir: Path) -> StopChannel:
    """Where the queue asks the run in `run_dir` to stop: the channel its ranks read under
    `cluster`'s launcher (`training.loop.stop_channel`: the run's file on the local launcher,
    the Ray cluster's board on Ray, this process joined to the cluster first)."""
    if cluster.launcher == "ray":
        from hetflow.training.launch.ray_train import connect, ray_address

        connect(ray_address(cluster))
    return stop_channel(cluster.launcher, run_dir)


def inbox_reader(folder: Path | None) -> Callable[[], list[QueueJob]]:
    """What a session asks for newly submitted jobs: each `*.json` in `folder` (a
    `QueueJob`, as `hetflow queue submit` writes it), oldest first, moved to `admitted/`
    once read; nothing where `folder` is None."""

    def read() -> list[QueueJob]:
        if folder is None or not folder.is_dir():
            return []
        done = folder / "admitted"
        done.mkdir(exist_ok=True)
        out = []
        for path in sorted(folder.glob("*.json")):
            out.append(QueueJob.model_validate_json(path.read_text()))
            path.rename(done / path.name)
        return out

    return read
