"""A job in a queue session (`tasks.queue_session`): what it is, where it stands (waiting,
running a segment, ended), the workers it holds and is bound for, and the checkpoint its
running segment was asked to stop at."""

from __future__ import annotations

from dataclasses import dataclass, field

from hetflow.config.queue import QueueJob
from hetflow.queue.jobs import Job
from hetflow.tasks.queue import Segment


@dataclass
class Live:
    """A job in the session."""

    job: QueueJob
    model: Job | None  # None where it failed or was cancelled before the queue modelled it
    arrived_s: float
    done: int = 0  # steps checkpointed
    workers: list[str] = field(default_factory=list)  # what its running segment holds
    target: list[str] | None = None
    future: object = None
    since_s: float = 0.0
    started_s: float | None = None
    finished_s: float | None = None
    segments: list[Segment] = field(default_factory=list)
    ended: str | None = None  # done, failed or cancelled (`ENDED_STATES`)
    reason: str = ""  # why it failed or was cancelled, in one line
    cancelling: bool = False  # asked to stop at its next checkpoint, and end there
    stop_at: int | None = None  # the checkpoint its running segment was asked to stop at
    joined: dict[str, float] = field(default_factory=dict)  # worker -> when it grew onto it
    across: bool = False  # bound for workers none of its own, in place (`switch.across`)

    @property
    def staying(self) -> bool:
        """Whether it runs a segment not asked to stop. One asked to stop ends at that
        checkpoint whatever is decided after (every rank may have read it): the queue places
        it afresh, as a waiting job, its workers free once the segment has ended."""
        return self.future is not None and self.stop_at is None

    def held_from(self, worker: str) -> float:
        """When its running segment began to hold `worker` (it grew onto it, or started on it)."""
        return self.joined.get(worker, self.since_s)

    @property
    def state(self) -> str:
        """What `hetflow queue list` says of it."""
        if self.ended:
            return self.ended
        if self.future is None:
            return "waiting"
        return "cancelling" if self.cancelling else "running"

    def stop_step(self, progress: int) -> int | None:
        """The checkpoint its running segment is asked to stop at, at `progress` steps done:
        the first at least two steps on (rank 0 of the run moves it to a later one that no
        rank has passed: `training.loop.stop_request`); None where the job ends first."""
        k = self.job.checkpoint_every
        at = -(-(progress + 2) // k) * k
        return at if at < self.job.steps else None
