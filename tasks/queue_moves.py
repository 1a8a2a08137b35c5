"""The queue's moves in place: a worker taken from a running elastic job (`QueueJob.in_place`,
`faults.on_loss: continue`) leaves it at the job's next step boundary while the others go on
(`training.elastic`: no stop at a checkpoint, no relaunch), and is free for another job once
its process has ended (`Moves.shrink`); a free worker given to a running elastic job is
started in its spare slot of the job and joins at a step boundary (`Moves.grow`,
`ElasticJob.add_worker`); and the Prefect slots the workers hold, one each (`hold_slots`,
`hold_slot`), so that a worker that leaves frees its slot at once: kept held for the job
that takes it next (`park_slot`), or given back where none does (`release_parked`).

Each worker's slot is held by a thread of its own, inside Prefect's own `concurrency` context
manager (its lease renewed there): a segment's task run holds its workers' slots while its
launch blocks its thread, and the session, in another thread, frees one of them when that
worker leaves; Prefect's context manager is entered and left in one thread.
"""

from __future__ import annotations

import contextvars
import json
import statistics
import threading
from dataclasses import dataclass
from pathlib import Path

from prefect.concurrency.sync import concurrency

from hetflow.training.launch.live import live_job


class SlotHold:
    """One slot of the global concurrency limit `limit`, held until `release` (idempotent);
    raises what acquiring raised (a `TimeoutError` past `timeout_s`)."""

    def __init__(self, limit: str, timeout_s: float) -> None:
        self._got, self._free = threading.Event(), threading.Event()
        self.error: BaseException | None = None
        run = contextvars.copy_context().run  # the caller's Prefect settings and run context
        self._thread = threading.Thread(target=run, args=(self._hold, limit, timeout_s))
        self._thread.daemon = True
        self._thread.start()
        self._got.wait()
        if self.error is not None:
            raise self.error

    def _hold(self, limit: str, timeout_s: float) -> None:
        try:
            with concurrency(limit, occupy=1, strict=True, timeout_seconds=timeout_s):
                self._got.set()
                self._free.wait()
        except BaseException as e:  # handed to the caller, in its thread
            self.error = e
        finally:
            self._got.set()

    def release(self) -> None:
        self._free.set()
        self._thread.join()


_HELD: dict[str, dict[str, SlotHold]] = {}  # job -> worker -> its slot
_PARKED: dict[str, SlotHold] = {}  # worker -> its slot, kept from the job it left in place
_LOCK = threading.Lock()


def _slot(worker: str, limit: str, timeout_s: float) -> SlotHold:
    """`worker`'s slot of `limit`: the one it kept from the job it left (`park_slot`), else
    one acquired now."""
    with _LOCK:
        kept = _PARKED.pop(worker, None)
    return kept if kept is not None else SlotHold(limit, timeout_s)


def hold_slots(job: str, limits: dict[str, str], timeout_s: float) -> None:
    """A slot for each worker of `limits` (worker -> its kind's limit), held for `job` until
    `free_slot` or `free_slots`; none held where one cannot be had."""
    held: dict[str, SlotHold] = {}
    try:
        for worker, limit in sorted(limits.items()):
            held[worker] = _slot(worker, limit, timeout_s)
    except BaseException:
        for h in held.values():
            h.release()
        raise
    with _LOCK:
        _HELD[job] = held


def hold_slot(job: str, worker: str, limit: str, timeout_s: float) -> None:
    """A slot of `limit` held for `job`'s `worker` besides those it holds (a worker it grew
    onto in place), until `free_slot` or `free_slots`."""
    h = _slot(worker, limit, timeout_s)
    with _LOCK:
        _HELD.setdefault(job, {})[worker] = h


def free_slot(job: str, worker: str) -> None:
    """`worker`'s slot, held for `job`, given back (a no-op where it holds none)."""
    with _LOCK:
        h = _HELD.get(job, {}).pop(worker, None)
    if h is not None:
        h.release()


def park_slot(job: str, worker: str) -> None:
    """`worker`'s slot, held for `job`, which it left in place, kept held for the job that
    takes it next (`hold_slots`, `hold_slot`), so that that job's launch does not acquire it
    again: on a Prefect server whose SQLite is busy an acquire is answered 503, and the
    client's retry waits 2 s (measured: docs/measurements/queue.md). A no-op where it holds
    none; `release_parked` gives back those no job takes."""
    with _LOCK:
        h = _HELD.get(job, {}).pop(worker, None)
        old = _PARKED.pop(worker, None) if h is not None else None
        if h is not None:
            _PARKED[worker] = h
    if old is not None:
        old.release()


def release_parked(keep: set[str]) -> None:
    """Each kept slot (`park_slot`) of a worker not in `keep` (no job holds it or is bound
    for it) given back."""
    with _LOCK:
        gone = [w for w in _PARKED if w not in keep]
        out = [_PARKED.pop(w) for w in gone]
    for h in out:
        h.release()


def free_slots(job: str) -> None:
    """Every slot held for `job` given back."""
    with _LOCK:
        held = _HELD.pop(job, {})
    for h in held.values():
        h.release()


def progress_step(run_dir: Path) -> int | None:
    """The step the run in `run_dir` has reached (progress.json), or None before its first."""
    try:
        return int(json.loads((run_dir / "progress.json").read_text())["step"])
    except (FileNotFoundError, ValueError, KeyError):
        return None


@dataclass
class _InPlace:
    """A worker moved in place: out of or into running `job` (rank `rank` of its run in
    `run_dir`), asked at `asked_s` (the session's clock), the job then at step `step`."""

    job: str
    worker: str
    rank: int
    run_dir: Path
    asked_s: float
    step: int


@dataclass
class Leaving(_InPlace):
    """A worker asked to leave `job` in place (`_InPlace`); `gone_s`, when its process had
    ended; `resumed_s`, when the job had stepped again on the workers it kept; `taker`, the
    job the worker went to (its run in `taker_dir`, from step `taker_from`), stepping at
    `taken_s`."""

    gone_s: float | None = None
    resumed_s: float | None = None
    taker: str | None = None
    taker_dir: Path | None = None
    taker_from: int = 0
    taken_s: float | None = None

    def figures(self) -> dict:
        """The move's times from its request (s): to the worker free, to the giving job
        stepping again, to the taking job stepping (None: not seen)."""
        rel = {"free_s": self.gone_s, "giver_s": self.resumed_s, "taker_s": self.taken_s}
        out = {k: None if v is None else round(v - self.asked_s, 3) for k, v in rel.items()}
        return {"job": self.job, "worker": self.worker, "to": self.taker, "step": self.step} | out


@dataclass
class Joining(_InPlace):
    """A worker added to running elastic `job` in place (`_InPlace`); `in_step`, the job's
    step when the worker was first seen in a generation; `joined_s`, when the job had
    stepped past it with the worker in; `leave`, the move in place that freed the worker,
    where one did."""

    leave: Leaving | None = None
    in_step: int | None = None
    joined_s: float | None = None
    over: bool = False  # its job's run ended first

    def figures(self) -> dict:
        """The grow's time from its request to the job stepping with the worker in
        (`taker_s`; None: not seen), in `Leaving.figures`' keys."""
        t = None if self.joined_s is None else round(self.joined_s - self.asked_s, 3)
        rel = {"free_s": None, "giver_s": None, "taker_s": t}
        return {"job": None, "worker": self.worker, "to": self.job, "step": self.step} | rel


class Moves:
    """The session's moves in place (see the module) and what they cost: `cost_s`, the median
    of the measured moves (from the request to the giving job stepping again), `default_s`
    before any; a grow waits up to `slot_wait_s` for the added worker's Prefect slot."""

    def __init__(self, default_s: float, slot_wait_s: float = 120.0) -> None:
        self.default_s, self.slot_wait_s = default_s, slot_wait_s
        self.leaving: list[Leaving] = []
        self.done: list[Leaving] = []
        self.joining: list[Joining] = []

    @property
    def cost_s(self) -> float:
        costs = [m.resumed_s - m.asked_s for m in self.done if m.resumed_s is not None]
        return statistics.median(costs) if costs else self.default_s

    def busy(self) -> set[str]:
        """The workers asked to leave whose process runs still."""
        return {m.worker for m in self.leaving if m.gone_s is None}

    def pending(self, job: str) -> set[str]:
        """The workers `job` was grown onto in place that no generation of it has taken in
        yet (`watch_joins`): they are not members to go on with, nor to admit another."""
        return {g.worker for g in self.joining if g.job == job and g.in_step is None and not g.over}

    def shrink(self, job: str, run_dir: Path, old: list[str], new: list[str], now: float) -> bool:
        """`job`, running elastic on `old` in `run_dir`, asked to go on with `new` (some of
        `old`, not none) in place: True where every worker it gives up was asked to leave (a
        worker its plan dropped runs no rank: free at once); False where it does not step
        yet (its launcher not started, its first step not done): ask again later."""
        members = live_job(run_dir)
        step = progress_step(run_dir)
        if members is None or step is None:
            return False
        for w in sorted(set(old) - set(new)):
            r = members.rank_of(w)
            if r is not None:
                members.release(r)
            self.leaving.append(Leaving(job, w, -1 if r is None else r, run_dir, now, step))
            print(f"queue: {job} lets {w} (rank {r}) go in place, at step {step}")
        return True

    def grow(
        self, job: str, run_dir: Path, added: list[str], limits: dict[str, str], now: float
    ) -> list[str] | None:
        """`job`, running elastic in `run_dir`, grown in place onto the free workers `added`:
        each one's slot held for it (`limits`: worker -> its kind's limit), then started in
        its free slot of the job (`Members.add`), to join at a step boundary. The workers
        added (fewer where a slot did not fit: the rest need a relaunch); None where the job
        does not step yet (ask again later)."""
        members = live_job(run_dir)
        step = progress_step(run_dir)
        if members is None or step is None:
            return None
        out = []
        for w in sorted(added):
            hold_slot(job, w, limits[w], timeout_s=self.slot_wait_s)
            try:
                r = members.add(w)
            except ValueError as e:
                free_slot(job, w)
                print(f"queue: {job} cannot take {w} in place: {e}")
                continue
            freed = [m for m in self.done if m.worker == w and m.taker is None]
            leave = freed[-1] if freed else None
            if leave is not None:
                leave.taker, leave.taker_dir, leave.taker_from = job, run_dir, step
            self.joining.append(Joining(job, w, r, run_dir, now, step, leave))
            out.append(w)
            print(f"queue: {job} takes {w} in place (rank {r}), at step {step}")
        return out

    def settle(self, now: float) -> list[Leaving]:
        """The workers whose process ended since last asked (free: their slots kept for the
        job that takes them, `park_slot`), and each move's time to the job stepping again,
        once it has."""
        freed = []
        for m in self.leaving:
            members = live_job(m.run_dir)
            if m.gone_s is None and (members is None or m.rank < 0 or members.gone(m.rank)):
                m.gone_s, m.step = now, progress_step(m.run_dir) or m.step
                park_slot(m.job, m.worker)
                freed.append(m)
            stepped = (progress_step(m.run_dir) or -1) > m.step
            if m.gone_s is not None and (members is None or stepped):
                m.resumed_s = now if members is not None else None
                self.done.append(m)
                if m.resumed_s is not None:
                    print(f"queue: {m.job} stepping again {now - m.asked_s:.2f} s after the move")
        self.leaving = [m for m in self.leaving if m not in self.done]
        return freed

    def hand(self, workers: list[str], job: str, run_dir: Path) -> None:
        """`job`, its run in `run_dir`, started on `workers`: each of them that left a job in
        place and went to none yet went to it."""
        for m in self.done + self.leaving:
            if m.worker in workers and m.gone_s is not None and m.taker is None:
                m.taker, m.taker_dir, m.taker_from = job, run_dir, progress_step(run_dir) or 0

    def watch(self, now: float) -> None:
        """Each taking job seen stepping since its start on a moved worker, or since a worker
        it grew onto in place joined (`watch_joins`)."""
        self.watch_joins(now)
        grown = {id(g.leave) for g in self.joining if g.leave is not None}
        for m in self.done + self.leaving:
            if m.taker_dir is not None and m.taken_s is None and id(m) not in grown:
                if (progress_step(m.taker_dir) or 0) > m.taker_from:
                    m.taken_s = now

    def watch_joins(self, now: float) -> None:
        """Each worker added in place seen in a generation of its job, then the job stepping
        past the step it had then (the move that freed it, its taker's time)."""
        for g in self.joining:
            if g.joined_s is not None or g.over:
                continue
            members, step = live_job(g.run_dir), progress_step(g.run_dir) or 0
            if members is None:
                g.over = True
            elif g.in_step is None and members.joined(g.rank):
                g.in_step = step
            elif g.in_step is not None and step > g.in_step:
                g.joined_s = now
                if g.leave is not None:
                    g.leave.taken_s = now
                print(f"queue: {g.job} stepping with {g.worker} {now - g.asked_s:.2f} s after")

    def watching(self) -> bool:
        """Whether a move is under way: a worker leaving, a job yet to step again."""
        moves = self.done + self.leaving
        joins = any(g.joined_s is None and not g.over for g in self.joining)
        return bool(self.leaving) or joins or any(m.taker and m.taken_s is None for m in moves)

    def figures(self) -> list[dict]:
        """Each move in place's times (`Leaving.figures`; a worker freed otherwise and
        taken in place, `Joining.figures`), in the order asked; `grown`: taken in place."""
        grown = {id(g.leave) for g in self.joining}
        rows = [
            (m.asked_s, m.figures() | {"grown": id(m) in grown}) for m in self.done + self.leaving
        ]
        rows += [
            (g.asked_s, g.figures() | {"grown": True}) for g in self.joining if g.leave is None
        ]
        return [r for _, r in sorted(rows, key=lambda x: x[0])]

    def count(self, job: str) -> int:
        """How many workers left `job` in place."""
        return sum(m.job == job for m in self.done + self.leaving)

    def grown(self, job: str) -> int:
        """How many workers joined `job` in place."""
        return sum(g.job == job for g in self.joining)
