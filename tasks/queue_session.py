"""One queue session: jobs arrive (the flow's list, after each one's delay, and those
`hetflow queue submit` leaves in the inbox), the policy decides at each arrival and end (the
allocator, `hetflow.queue.switch.decide`, and again when a job's steps put the prior it was
placed from in seconds, `tasks.queue_pace`; or `fifo`, `hetflow.queue.fifo`, which never
moves a running job and needs no job's step times, so it measures none), and each job runs
as a train run on its workers (`tasks.queue.run_segment`) until it ends or the queue moves
its workers: then it is asked to stop at its next checkpoint (through the run's stop channel,
`tasks.queue.job_stop_channel`: a file, or the Ray cluster's board), and a new segment
resumes from there on the workers it moves to. A job that runs elastic (`QueueJob.in_place`)
moves in place instead (`tasks.queue_moves`): those of its workers it gives up leave at its
next step boundary, it goes on without them in the same segment, and they are free once
their processes have ended; those it takes, once free, join it at a step boundary in the
spare slots it was launched with (`tasks.queue.spare_workers`); one that keeps none of its
workers takes its new ones first and lets its own go once one is in (`switch.across`: not
where two such jobs would each need the other's worker first); a move is priced at its
measured cost then (`switch.InPlace`).

A job that fails (its step-time model, its profile or a segment raised) ends alone, `failed`
with its one-line reason, and its workers go back to the others; `hetflow queue cancel`
ends a job, `cancelled`: at once where it holds no workers, else at its next checkpoint,
asked as a move is (`tasks.queue_ends`).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from prefect.artifacts import create_table_artifact

from hetflow.config import ClusterSpec, DatasetSpec, TrackingConfig
from hetflow.config.queue import QueueJob
from hetflow.queue.allocate import Holding, step_s
from hetflow.queue.fifo import fifo
from hetflow.queue.jobs import check_job
from hetflow.queue.switch import InPlace, across, decide
from hetflow.tasks.queue import (
    SLOT_WAIT_S,
    Segment,
    cluster_kinds,
    job_model,
    job_prior,
    job_stop_channel,
    queue_model,
    run_segment,
    slot_name,
)
from hetflow.tasks.queue_ends import reason_of, record_end, state_rows, take_cancel_requests
from hetflow.tasks.queue_live import Live
from hetflow.tasks.queue_moves import Moves, release_parked
from hetflow.tasks.queue_pace import Units
from hetflow.tasks.train import stable_run_dir
from hetflow.training.elastic.pool import session_pool
from hetflow.training.launch.agents import agent_pool
from hetflow.training.launch.pool import WarmPool
from hetflow.training.loop.progress import read_points


@dataclass
class Session:
    """The session's loop (see the module); `inbox` returns jobs submitted since it last
    asked, `state` is where `hetflow queue list` reads who holds what, `cancels` the folder
    of `hetflow queue cancel`'s requests (those left from an earlier session are dropped),
    `policy` one of `config.queue.QUEUE_POLICIES`; `in_place_s`, what a move in place costs
    until the session has measured one (`queue_moves.Moves.cost_s`)."""

    cluster: ClusterSpec
    dataset: DatasetSpec
    tracking: TrackingConfig
    parent_run_id: str
    switch_s: float
    inbox: Callable[[], list[QueueJob]]
    state: Path | None = None
    cancels: Path | None = None
    jobs: list[Live] = field(default_factory=list)
    spans: list[tuple[str, str, float, float]] = field(default_factory=list)
    measuring_s: float = 0.0
    policy: str = "allocator"
    in_place_s: float = 1.0
    measure_first: bool = False
    published_prior: bool = True

    def __post_init__(self) -> None:
        self.workers, self.kinds = cluster_kinds(self.cluster)
        self.moves = Moves(self.in_place_s, SLOT_WAIT_S)
        self.units = Units()  # the priors' lines put in seconds by the jobs' steps
        self.t0 = time.monotonic()
        self.pending: list[QueueJob] = []  # taken from the inbox or the flow, not yet arrived
        self.seen: dict[str, float] = {}  # when each inbox job was read
        self.warm = contextlib.ExitStack()  # closes the session's warm pools (`open_pools`)
        self.pool: WarmPool | None = None  # its warm workers
        self.agents: WarmPool | None = None  # its torchrun agents
        take_cancel_requests(self.cancels)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def admit(self, job: QueueJob, arrived_s: float) -> None:
        """`job`, arrived at `arrived_s`, taken in, its step time on each kind known: from the
        history or a prior, nothing launched (`job_prior`; a prior's lines put in seconds by
        the first steps of a job of its recipe, `paced`), or where `measure_first` its kinds
        the history lacks profiled now (`job_model`); none under `fifo`, blind to the device
        type. Failed alone where that raises or no worker holds it. The modelling's wall time
        is the allocator's to pay: the job's completion counts from `arrived_s`, and the
        session does nothing else meanwhile (`measuring_s` sums it)."""
        t = time.monotonic()
        try:
            if self.policy == "fifo":
                model = queue_model(job)
            elif self.measure_first:
                self.open_pools(elastic=False)  # the next job's measuring on a warm agent
                model, _ = job_model(job, self.cluster, self.dataset)
            else:
                known = job_prior(job, self.cluster, self.dataset, self.published_prior)
                model = self.units.admit(job, *known)
            check_job(model, self.kinds)
        except Exception as e:  # the job's own failure: the others go on
            self.jobs.append(Live(job, None, arrived_s))
            self.end(self.jobs[-1], "failed", reason_of(e))
            return
        finally:
            self.measuring_s += time.monotonic() - t if self.policy != "fifo" else 0.0
        self.jobs.append(Live(job, model, arrived_s))
        print(f"queue: {job.name} ({job.priority}) arrived")

    def end(self, j: Live, state: str, reason: str) -> None:
        """`j` ended `state` (failed, cancelled) for `reason`, holding no workers; its MLflow
        run ended so (`record_end`)."""
        j.ended, j.reason, j.finished_s = state, reason, self.now()
        j.target, j.cancelling = None, False
        where = (self.cluster, self.dataset, self.parent_run_id)
        record_end(j.job, state, reason, stable_run_dir(j.job.name), self.tracking, where)
        print(f"queue: {j.job.name} {state}: {reason}")

    def take_cancels(self) -> bool:
        """Each of `hetflow queue cancel`'s requests met: a job not arrived yet, or waiting
        for workers, ended at once; a running one asked to stop at its next checkpoint (and
        ended there, `end_segment`). True when a job ended."""
        ended = False
        for name in take_cancel_requests(self.cancels):
            live = [j for j in self.active() if j.job.name == name]
            if any(q.name == name for q in self.pending):
                job = next(q for q in self.pending if q.name == name)
                self.pending.remove(job)
                self.jobs.append(Live(job, None, self.now()))
                self.end(self.jobs[-1], "cancelled", "cancelled before it arrived")
            elif live and live[0].future is None:
                self.end(live[0], "cancelled", f"cancelled while waiting, at step {live[0].done}")
            elif live:
                live[0].cancelling = True
                self.ask_stop(live[0])
                continue
            ended = True
        return ended

    def active(self) -> list[Live]:
        return [j for j in self.jobs if j.finished_s is None]

    def allocate(self, act: list[Live], holding: Holding) -> Holding:
        """The allocator's workers for the active jobs (`switch.decide`); those running a
        segment asked to stop are placed as waiting ones (`Live.staying`)."""
        running = self.running(act)
        left = {
            j.job.name: (j.job.steps - j.done) * step_s(j.model, self.kinds_of(j.workers))
            for j in act
            if j.staying
        }
        models = [j.model for j in act]
        elastic = frozenset(j.job.name for j in act if j.job.in_place)
        until = {j.job.name: self.until_stop_s(j) for j in act if j.staying}
        in_place = InPlace(elastic, self.moves.cost_s, until)
        return decide(
            models, holding, running, left, self.workers, self.kinds, self.switch_s, True, in_place
        )

    @staticmethod
    def running(act: list[Live]) -> Holding:
        """The workers each job of `act` that stays on its segment holds (`Live.staying`)."""
        return {j.job.name: j.workers for j in act if j.staying}

    def until_stop_s(self, j: Live) -> float:
        """The seconds until running `j` would reach the checkpoint a stop asks for now (its
        steps to it at its step time; 0 where it would end first)."""
        progress = job_stop_channel(self.cluster, stable_run_dir(j.job.name)).progress() or j.done
        at = j.stop_step(progress)
        return 0.0 if at is None else (at - progress) * step_s(j.model, self.kinds_of(j.workers))

    def decide(self) -> None:
        act = self.active()
        holding = {j.job.name: (j.workers if j.staying else []) or j.target or [] for j in act}
        holding = {n: w for n, w in holding.items() if w}
        if self.policy == "fifo":
            asks = {j.job.name: j.job.workers for j in act}
            got = fifo([j.model for j in act], holding, self.workers, self.kinds, asks)
        else:
            got = self.allocate(act, holding)
        over = across(self.running(act), got, {j.job.name for j in act if j.job.in_place})
        for j in act:
            new = got.get(j.job.name, [])
            if not j.staying:  # waiting, or bound to end at the checkpoint asked
                j.target = new
                continue
            j.target = None if sorted(new) == sorted(j.workers) else new
            j.across = j.job.name in over
            if j.target is not None and not self.in_place(j):
                self.ask_stop(j)

    def in_place(self, j: Live) -> bool:
        """Whether running `j` moves to its target in place: it runs elastic and keeps some
        of its workers, or keeps none and is free to take its new ones first (`j.across`,
        `switch.across`). Done where it steps already, else at a later tick: the workers it
        gives up asked to leave at its next step boundary (`Moves.shrink`; not before one it
        keeps is a member, not a worker still joining, `Moves.pending`: a job moving across
        lets its own go once a new one is in), and each worker it takes, once free, started
        in its spare slot of the job to join at a boundary (`Moves.grow`; a worker with no
        slot there: a relaunch, `ask_stop`)."""
        new = j.target or []
        if not (j.job.in_place and (set(new) & set(j.workers) or j.across)) or j.cancelling:
            return False
        if j.stop_at is not None:  # asked to stop already: that stands
            return False
        folder, name = stable_run_dir(j.job.name), j.job.name
        keep = [w for w in j.workers if w in new]
        if set(j.workers) - set(new) and keep:
            if not set(keep) - self.moves.pending(name):  # none of them in yet: later
                return True
            if not self.moves.shrink(name, folder, j.workers, keep, self.now()):
                return True
            j.workers = keep
        busy = {w for o in self.jobs if o is not j for w in o.workers} | self.moves.busy()
        free = [w for w in new if w not in j.workers and w not in busy]
        if free:
            limits = {w: slot_name(self.workers[w]) for w in free}
            added = self.moves.grow(name, folder, free, limits, self.now())
            if added is None:
                return True
            j.workers += added
            j.joined |= dict.fromkeys(added, self.now())
            if len(added) < len(free):
                self.ask_stop(j)
        if sorted(j.workers) == sorted(new):
            j.target = None
        return True

    def shrink_waiting(self) -> None:
        """Each running job bound for a move in place that was not stepping yet, moved now
        where it steps."""
        for j in self.active():
            if j.future is not None and j.target is not None and j.stop_at is None:
                self.in_place(j)

    def settle(self) -> bool:
        """The workers that left a job in place and are free now (`Moves.settle`), each one's
        stretch with its job ended; True when any is."""
        freed = self.moves.settle(self.now())
        live = {j.job.name: j for j in self.jobs}
        self.spans += [(m.job, m.worker, live[m.job].held_from(m.worker), m.gone_s) for m in freed]
        return bool(freed)

    def ask_stop(self, j: Live) -> None:
        """`j`'s running segment asked to stop at its next checkpoint, unless it was asked
        already (that checkpoint stands: every rank may have read it)."""
        if j.stop_at is not None:
            return
        folder = stable_run_dir(j.job.name)
        channel = job_stop_channel(self.cluster, folder)
        progress = channel.progress() or j.done  # where rank 0 runs, on Ray too
        at = j.stop_step(progress)
        why = "its cancel" if j.cancelling else f"a move to {j.target}"
        if at is not None:
            channel.write(at)
            j.stop_at = at
            print(f"queue: {j.job.name} asked to stop at step {at} for {why}")
        elif j.cancelling:
            print(f"queue: {j.job.name} ends before its next checkpoint: it completes")

    def paced(self) -> bool:
        """Whether a running job's steps gave its recipe a kind's line or its unit just now
        (`Units.observe`)."""
        if self.policy == "fifo":
            return False

        def progress_at(j: Live):
            return job_stop_channel(self.cluster, stable_run_dir(j.job.name)).progress_at()

        def points_at(j: Live):
            return read_points(stable_run_dir(j.job.name))

        def settled(j: Live) -> bool:
            return not self.moves.pending(j.job.name) & set(j.workers)

        how = (progress_at, points_at, self.kinds_of, self.workers, settled, self.now())
        return self.units.observe(self.jobs, *how)

    def kinds_of(self, names: list[str]):
        return [self.kinds[self.workers[w]] for w in names]

    def end_segment(self, j: Live) -> bool:
        """`j`'s segment ended: the job done, failed (what the segment raised, in one line),
        cancelled at its checkpoint, or bound for its next workers. True when the queue
        should decide again (the job ended: its workers are free)."""
        try:
            seg: Segment | None = j.future.result()
        except Exception as e:  # the job's own failure: the others go on
            seg, why = None, reason_of(e)
        self.spans += [(j.job.name, w, j.held_from(w), self.now()) for w in j.workers]
        nxt = j.workers if j.target is None else j.target
        j.future, j.workers, j.target, j.stop_at = None, [], list(nxt), None
        j.joined = {}
        if seg is None:
            self.end(j, "failed", why)
            return True
        j.segments.append(seg)
        j.done = seg.to_step
        if j.done >= j.job.steps:
            j.finished_s, j.target, j.ended = self.now(), None, "done"
            print(f"queue: {j.job.name} done at {j.finished_s:.0f} s")
            return True
        if j.cancelling:
            self.end(j, "cancelled", f"cancelled at its checkpoint, step {j.done}")
            return True
        return False

    def start_ready(self) -> bool:
        """Each waiting job whose workers are all free started on them; True if any was."""
        started = False
        busy = {w for j in self.jobs for w in j.workers} | self.moves.busy()
        for j in self.active():
            if j.future is None and j.target and not busy & set(j.target):
                self.open_pools(j.job.in_place)
                j.workers, j.target, j.since_s = list(j.target), None, self.now()
                j.stop_at = None
                j.started_s = j.since_s if j.started_s is None else j.started_s
                job_stop_channel(self.cluster, stable_run_dir(j.job.name)).clear()
                self.moves.hand(j.workers, j.job.name, stable_run_dir(j.job.name))
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

    def open_pools(self, elastic: bool) -> None:
        """Open the session's warm pools where they are not open, to the session's end
        (`run`). `elastic`: its warm workers (`training.elastic.pool.session_pool`), one per
        worker of the cluster: every elastic job's ranks (`QueueJob.in_place`), those it
        starts with and those it takes in place, are processes started ahead, torch
        imported, and a job that ends leaves the pool to the next. Else one torchrun agent
        kept imported (`training.launch.agents`, on this host's launcher only) for the
        launches under torchrun: the allocator's measuring, the jobs that do not run
        elastic."""
        if elastic and self.pool is None:
            self.pool = self.warm.enter_context(session_pool(self.cluster.world_size))
        if not elastic and self.agents is None and self.cluster.launcher == "local":
            self.agents = self.warm.enter_context(agent_pool(None))

    def write_state(self, publish: bool) -> None:
        """The jobs' state for `hetflow queue list`; where `publish`, also as the Prefect
        artifact `queue-now` (each version a change: who holds which workers)."""
        rows = state_rows(self.jobs, self.pending)
        if self.state is not None:  # whole, for `hetflow queue list` reading it meanwhile
            tmp = self.state.with_name(f".{self.state.name}.tmp")
            tmp.write_text(json.dumps(rows, indent=1))
            os.replace(tmp, self.state)
        if publish:
            create_table_artifact(rows, key="queue-now", description="who holds which workers")

    def run(self, planned: list[QueueJob], tick_s: float = 1.0) -> None:
        """Until every job has arrived and ended, and the inbox is empty."""
        self.pending = list(planned)
        with self.warm:
            self.warm.callback(release_parked, set())  # no worker's slot kept past the session
            self._loop(tick_s)

    def _loop(self, tick_s: float) -> None:
        while True:
            new = self.inbox()
            self.seen |= {q.name: self.now() for q in new}  # an inbox job arrives once read
            self.pending = sorted(self.pending + new, key=lambda q: q.arrive_after_s)
            ended = self.take_cancels()
            arrivals = [q for q in self.pending if q.arrive_after_s <= self.now()]
            if not (self.pending or self.active()):
                self.write_state(publish=ended)
                return
            self.write_state(publish=False)  # the arrivals, queued while they are modelled
            for q in arrivals:
                self.pending.remove(q)
                self.admit(q, max(q.arrive_after_s, self.seen.get(q.name, 0.0)))
            for j in self.active():
                if j.future is not None and j.future.state.is_final():
                    ended |= self.end_segment(j)
            if arrivals or ended or self.paced():
                self.decide()
            self.shrink_waiting()
            freed = self.settle()
            self.moves.watch(self.now())
            started = self.start_ready()
            release_parked({w for j in self.active() for w in j.workers + (j.target or [])})
            self.write_state(publish=bool(arrivals or ended or started or freed))
            time.sleep(min(tick_s, 0.05) if self.moves.watching() else tick_s)
