"""The queue's moves in place: a worker taken from a running elastic job (`QueueJob.in_place`,
`faults.on_loss: continue`) leaves it at the job's next step boundary while the others go on
(`training.elastic`: no stop at a checkpoint, no relaunch), and is free for another job once
its process has ended; and the Prefect slots the workers hold, one each (`hold_slots`), so
that a worker that leaves gives its slot back at once.

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
_LOCK = threading.Lock()


def hold_slots(job: str, limits: dict[str, str], timeout_s: float) -> None:
    """A slot for each worker of `limits` (worker -> its kind's limit), held for `job` until
    `free_slot` or `free_slots`; none held where one cannot be had."""
    held: dict[str, SlotHold] = {}
    try:
        for worker, limit in sorted(limits.items()):
            held[worker] = SlotHold(limit, timeout_s)
    except BaseException:
        for h in held.values():
            h.release()
        raise
    with _LOCK:
        _HELD[job] = held


def free_slot(job: str, worker: str) -> None:
    """`worker`'s slot, held for `job`, given back (a no-op where it holds none)."""
    with _LOCK:
        h = _HELD.get(job, {}).pop(worker, None)
    if h is not None:
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
class Leaving:
    """A worker asked to leave `job` in place (rank `rank` of its run in `run_dir`) at `asked_s`
    (the session's clock), the job then at step `step`; `gone_s`, when its process had ended;
    `resumed_s`, when the job had stepped again on the workers it kept; `taker`, the job the
    worker went to (its run in `taker_dir`, from step `taker_from`), stepping at `taken_s`."""

    job: str
    worker: str
    rank: int
    run_dir: Path
    asked_s: float
    step: int
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


class Moves:
    """The session's moves in place (see the module) and what they cost: `cost_s`, the median
    of the measured moves (from the request to the giving job stepping again), `default_s`
    before any."""

    def __init__(self, default_s: float) -> None:
        self.default_s = default_s
        self.leaving: list[Leaving] = []
        self.done: list[Leaving] = []

    @property
    def cost_s(self) -> float:
        costs = [m.resumed_s - m.asked_s for m in self.done if m.resumed_s is not None]
        return statistics.median(costs) if costs else self.default_s

    def busy(self) -> set[str]:
        """The workers asked to leave whose process runs still."""
        return {m.worker for m in self.leaving if m.gone_s is None}

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

    def settle(self, now: float) -> list[Leaving]:
        """The workers whose process ended since last asked (their slots given back: they
        are free), and each move's time to the job stepping again, once it has."""
        freed = []
        for m in self.leaving:
            members = live_job(m.run_dir)
            if m.gone_s is None and (members is None or m.rank < 0 or members.gone(m.rank)):
                m.gone_s, m.step = now, progress_step(m.run_dir) or m.step
                free_slot(m.job, m.worker)
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
        """Each taking job seen stepping since its start on a moved worker."""
        for m in self.done + self.leaving:
            if m.taker_dir is not None and m.taken_s is None:
                if (progress_step(m.taker_dir) or 0) > m.taker_from:
                    m.taken_s = now

    def watching(self) -> bool:
        """Whether a move is under way: a worker leaving, a job yet to step again."""
        moves = self.done + self.leaving
        return bool(self.leaving) or any(m.taker and m.taken_s is None for m in moves)

    def figures(self) -> list[dict]:
        """Each move in place's times (`Leaving.figures`), in the order asked."""
        return [m.figures() for m in sorted(self.done + self.leaving, key=lambda m: m.asked_s)]

    def count(self, job: str) -> int:
        """How many workers left `job` in place."""
        return sum(m.job == job for m in self.done + self.leaving)
