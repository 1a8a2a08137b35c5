"""One queue session: jobs arrive (the flow's list, after each one's delay, and those
`hetflow queue submit` leaves in the inbox), the policy decides at each arrival and end (the
allocator, `hetflow.queue.switch.decide`; or `fifo`, `hetflow.queue.fifo`, which never moves a
running job and needs no job's step times, so it measures none), and each job runs as a train
run on its workers (`tasks.queue.run_segment`) until it ends or the queue moves its workers:
then it is asked to stop at its next checkpoint (`RUN_DIR/stop_at`), and a new segment
resumes from there on the workers it moves to.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from prefect.artifacts import create_table_artifact

from hetflow.config import ClusterSpec, DatasetSpec, TrackingConfig
from hetflow.config_queue import QueueJob
from hetflow.queue.allocate import Holding, step_s
from hetflow.queue.fifo import fifo
from hetflow.queue.jobs import Job, check_job
from hetflow.queue.switch import decide
from hetflow.tasks.queue import Segment, cluster_kinds, job_model, queue_model, run_segment
from hetflow.tasks.train import stable_run_dir
from hetflow.training.loop.progress import STOP_FILE


@dataclass
class Live:
    """A job in the session."""

    job: QueueJob
    model: Job
    arrived_s: float
    done: int = 0  # steps checkpointed
    workers: list[str] = field(default_factory=list)  # what its running segment holds
    target: list[str] | None = None
    future: object = None
    since_s: float = 0.0
    started_s: float | None = None
    finished_s: float | None = None
    segments: list[Segment] = field(default_factory=list)

    def stop_step(self, progress: int) -> int | None:
        """The checkpoint its running segment stops at to move, asked at `progress` steps
        done: the first at least two steps on (`TrainingLoop.stop_asked`); None where the
        job ends first."""
        k = self.job.checkpoint_every
        at = -(-(progress + 2) // k) * k
        return at if at < self.job.steps else None


@dataclass
class Session:
    """The session's loop (see the module); `inbox` returns jobs submitted since it last
    asked, `state` is where `hetflow queue list` reads who holds what, `policy` one of
    `config_queue.QUEUE_POLICIES`."""

    cluster: ClusterSpec
    dataset: DatasetSpec
    tracking: TrackingConfig
    parent_run_id: str
    switch_s: float
    inbox: Callable[[], list[QueueJob]]
    state: Path | None = None
    jobs: list[Live] = field(default_factory=list)
    spans: list[tuple[str, str, float, float]] = field(default_factory=list)
    measuring_s: float = 0.0
    policy: str = "allocator"

    def __post_init__(self) -> None:
        self.workers, self.kinds = cluster_kinds(self.cluster)
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def admit(self, job: QueueJob) -> None:
        if self.policy == "fifo":  # blind to the device type: no step times to measure
            model, measured = queue_model(job), 0.0
        else:
            model, measured = job_model(job, self.cluster, self.dataset)
        self.measuring_s += measured
        check_job(model, self.kinds)
        self.jobs.append(Live(job, model, self.now()))
        print(f"queue: {job.name} ({job.priority}) arrived")

    def active(self) -> list[Live]:
        return [j for j in self.jobs if j.finished_s is None]

    def allocate(self, act: list[Live], holding: Holding) -> Holding:
        """The allocator's workers for the active jobs (`switch.decide`)."""
        running = {j.job.name: j.workers for j in act if j.future is not None}
        left = {
            j.job.name: (j.job.steps - j.done) * step_s(j.model, self.kinds_of(j.workers))
            for j in act
            if j.future is not None
        }
        models = [j.model for j in act]
        return decide(models, holding, running, left, self.workers, self.kinds, self.switch_s)

    def decide(self) -> None:
        act = self.active()
        holding = {j.job.name: j.workers or j.target or [] for j in act}
        holding = {n: w for n, w in holding.items() if w}
        if self.policy == "fifo":
            asks = {j.job.name: j.job.workers for j in act}
            got = fifo([j.model for j in act], holding, self.workers, self.kinds, asks)
        else:
            got = self.allocate(act, holding)
        for j in act:
            new = got.get(j.job.name, [])
            if j.future is None:
                j.target = new
                continue
            j.target = None if sorted(new) == sorted(j.workers) else new
            if j.target is not None:
                self.ask_stop(j)

    def ask_stop(self, j: Live) -> None:
        """`j`'s running segment asked to stop at its next checkpoint."""
        folder = stable_run_dir(j.job.name)
        try:
            progress = json.loads((folder / "progress.json").read_text())["step"]
        except (FileNotFoundError, ValueError):
            progress = j.done
        at = j.stop_step(progress)
        if at is not None:
            (folder / STOP_FILE).write_text(str(at))
            print(f"queue: {j.job.name} asked to stop at step {at} for {j.target}")

    def kinds_of(self, names: list[str]):
        return [self.kinds[self.workers[w]] for w in names]

    def end_segment(self, j: Live) -> bool:
        """`j`'s segment ended; True when the queue should decide again (it ended)."""
        seg: Segment = j.future.result()
        j.segments.append(seg)
        j.done, j.future = seg.to_step, None
        self.spans += [(j.job.name, w, j.since_s, self.now()) for w in j.workers]
        nxt = j.workers if j.target is None else j.target
        j.workers, j.target = [], list(nxt)
        if j.done >= j.job.steps:
            j.finished_s, j.target = self.now(), None
            print(f"queue: {j.job.name} done at {j.finished_s:.0f} s")
            return True
        return False

    def start_ready(self) -> bool:
        """Each waiting job whose workers are all free started on them; True if any was."""
        started = False
        busy = {w for j in self.jobs for w in j.workers}
        for j in self.active():
            if j.future is None and j.target and not busy & set(j.target):
                j.workers, j.target, j.since_s = list(j.target), None, self.now()
                j.started_s = j.since_s if j.started_s is None else j.started_s
                (stable_run_dir(j.job.name) / STOP_FILE).unlink(missing_ok=True)
                j.future = run_segment.submit(
                    j.job,
                    self.cluster,
                    j.workers,
                    self.dataset,
                    self.tracking,
                    self.parent_run_id,
                )
                busy |= set(j.workers)
                started = True
        return started

    def write_state(self, publish: bool) -> None:
        """The jobs' state for `hetflow queue list`; where `publish`, also as the Prefect
        artifact `queue-now` (each version a change: who holds which workers)."""
        rows = [
            {
                "name": j.job.name,
                "priority": j.job.priority,
                "state": "done" if j.finished_s else "running" if j.future else "waiting",
                "workers": j.workers,
                "steps_done": j.done,
                "steps": j.job.steps,
                "arrived_s": round(j.arrived_s, 1),  # after the session started
            }
            for j in self.jobs
        ]
        if self.state is not None:
            self.state.write_text(json.dumps(rows, indent=1))
        if publish:
            create_table_artifact(rows, key="queue-now", description="who holds which workers")

    def run(self, planned: list[QueueJob], tick_s: float = 1.0) -> None:
        """Until every job has arrived and ended, and the inbox is empty."""
        later = list(planned)
        while True:
            later = sorted(later + self.inbox(), key=lambda q: q.arrive_after_s)
            arrivals = [q for q in later if q.arrive_after_s <= self.now()]
            later = [q for q in later if q not in arrivals]
            if not (later or self.active() or arrivals):
                return
            for q in arrivals:
                self.admit(q)
            ended = False
            for j in self.active():
                if j.future is not None and j.future.state.is_final():
                    ended |= self.end_segment(j)
            if arrivals or ended:
                self.decide()
            started = self.start_ready()
            self.write_state(publish=bool(arrivals or ended or started))
            time.sleep(tick_s)
