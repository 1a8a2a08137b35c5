"""Where a stop request travels from the queue to rank 0 of a run (`StopChannel`): the run's
own file on this host (`FileStopChannel`, the local launcher), or the Ray cluster's own API
(`RayStopChannel`, the Ray launcher), which every node of the cluster reaches.

The Ray channel is a named, detached actor (`StopBoard`, name `BOARD_NAME` in namespace
`BOARD_NAMESPACE`, no CPU): named actors are Ray Core's public, documented way for processes
of any job on any node to find one shared object by name (`ray.get_actor`), where
`ray.experimental.internal_kv` is internal and unstable. Detached, so that it does not go with
the handle of the task that made it (a Prefect task thread of the queue); it holds one small
entry per run, cleared when the run's segment starts, and goes with the Ray cluster. Rank 0
looks the actor up by name once, and asks it without waiting for the answer at each step
(the answer is read at a later step; a request reaches the run a step or two after it is
written, which the stop protocol allows: `stop_request.stop_step`); its first ask, at the
run's first step, is awaited, so that a request written before the run started is seen there.

Which channel a run gets follows from its spec (`channel_of`); the queue writes through the
same one (`stop_channel`). Nothing here imports Ray at module level: a torchrun rank never
loads it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from hetflow.training.loop.progress import PROGRESS_FILE, STOP_FILE

BOARD_NAME = "hetflow-stop-requests"
BOARD_NAMESPACE = "hetflow"
LOOK_EVERY_S = 5.0  # how often rank 0 looks for the board where none exists yet
FIRST_ANSWER_S = 10.0  # how long rank 0 waits for the board's first answer


class StopChannel:
    """A run's stop request, the step it names: `write` (the queue), `read` (rank 0: the
    step written, or None), `clear` (before a segment of the run starts); and how far the run
    got: `report` (rank 0, each step), `progress` (the queue: the step reported last, or
    None before the first), so that the queue reads a run's progress wherever rank 0 runs."""

    def report(self, step: int) -> None:
        """Nothing, for a channel that carries no progress."""

    def progress(self) -> int | None:
        return None

    def progress_at(self) -> tuple[int, float] | None:
        """`progress` and when it was reached (`time.time()`): here, when it is read."""
        step = self.progress()
        return None if step is None else (step, time.time())

    def write(self, step: int) -> None:
        raise NotImplementedError

    def read(self) -> int | None:
        raise NotImplementedError

    def clear(self) -> None:
        raise NotImplementedError


class FileStopChannel(StopChannel):
    """`RUN_DIR/stop_at` (`progress.STOP_FILE`), the step as text: seen on this host only."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / STOP_FILE

    def write(self, step: int) -> None:
        self.path.write_text(str(step))

    def read(self) -> int | None:
        try:
            return int(self.path.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)

    def progress(self) -> int | None:
        """The step in the run's progress.json, which rank 0 writes beside the request
        (`progress.ProgressFile`: its record, so `report` adds nothing), or None before."""
        try:
            return int(json.loads((self.path.parent / PROGRESS_FILE).read_text())["step"])
        except (FileNotFoundError, ValueError, KeyError):
            return None

    def progress_at(self) -> tuple[int, float] | None:
        """`progress` and when rank 0 wrote it: the file's modification time (it rewrites the
        file in place every step, `progress.ProgressFile`)."""
        path = self.path.parent / PROGRESS_FILE
        for _ in range(3):  # a step written between the stat and the read: again
            try:
                at = path.stat().st_mtime
                step = self.progress()
                if path.stat().st_mtime == at:
                    return None if step is None else (step, at)
            except FileNotFoundError:
                return None
        return None


class StopBoard:
    """The Ray actor behind `RayStopChannel`: each run's requested step, by the run's name."""

    def __init__(self) -> None:
        self.steps: dict[str, int] = {}
        self.reached: dict[str, int] = {}  # each run's progress, as its rank 0 reports it

    def set(self, key: str, step: int) -> None:
        self.steps[key] = step

    def get(self, key: str) -> int | None:
        return self.steps.get(key)

    def drop(self, key: str) -> None:
        self.steps.pop(key, None)
        self.reached.pop(key, None)

    def report(self, key: str, step: int) -> None:
        self.reached[key] = step

    def progress(self, key: str) -> int | None:
        return self.reached.get(key)


def board(create: bool):
    """The board's actor handle (made where `create` and none exists); None where it does
    not exist and `create` is False. Needs a connected Ray (`ray.init`)."""
    import ray

    if not create:
        try:
            return ray.get_actor(BOARD_NAME, namespace=BOARD_NAMESPACE)
        except ValueError:  # Ray's answer for a name no live actor holds
            return None
    return (
        ray.remote(StopBoard)
        .options(
            name=BOARD_NAME,
            namespace=BOARD_NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
        )
        .remote()
    )


class RayStopChannel(StopChannel):
    """The run `key`'s entry on the cluster's `StopBoard` (see the module). The writer's side
    (`write`, `clear`) makes the board; the reader's (`read`, rank 0 in a Ray worker) only
    looks for it, every `LOOK_EVERY_S` while there is none; a board that went is looked for
    anew, the request read so far kept: a lost board never ends the run."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.actor = None
        self.next_look = 0.0
        self.pending = None  # rank 0's ask not answered yet
        self.asked_once = False
        self.last: int | None = None

    def write(self, step: int) -> None:
        import ray

        ray.get(board(create=True).set.remote(self.key, step))

    def clear(self) -> None:
        import ray

        ray.get(board(create=True).drop.remote(self.key))

    def report(self, step: int) -> None:
        """Sent without waiting for its answer, on the board `read` found (none yet: not
        sent; rank 0 reads before each step, so it finds the board as soon as it exists)."""
        if self.actor is not None:
            self.actor.report.remote(self.key, step)

    def progress(self) -> int | None:
        import ray

        actor = board(create=False)
        return None if actor is None else ray.get(actor.progress.remote(self.key))

    def read(self) -> int | None:
        import ray

        if self.actor is None:
            if time.monotonic() < self.next_look:
                return self.last
            self.actor = board(create=False)
            if self.actor is None:
                self.next_look = time.monotonic() + LOOK_EVERY_S
                return self.last
        if self.pending is None:
            self.pending = self.actor.get.remote(self.key)
        wait_s = 0 if self.asked_once else FIRST_ANSWER_S
        self.asked_once = True
        done, _ = ray.wait([self.pending], timeout=wait_s)
        if done:
            ref, self.pending = self.pending, None
            try:
                self.last = ray.get(ref)
            except ray.exceptions.RayError:  # the board went (its node, the head): look again
                self.actor, self.next_look = None, time.monotonic() + LOOK_EVERY_S
        return self.last


def stop_channel(launcher: str, run_dir: str | Path) -> StopChannel:
    """The channel of the run in `run_dir` under `launcher` ('ray': the board, keyed by the
    run directory's name, the run's name; else the file)."""
    if launcher == "ray":
        return RayStopChannel(Path(run_dir).name)
    return FileStopChannel(run_dir)


def channel_of(spec) -> StopChannel:
    """The channel a run of `spec` (a `RunSpec`) reads: the board where its ranks are Ray
    Train workers (the Ray launcher, but for `faults.on_loss: continue`, whose own launcher
    runs them on this host), else the file."""
    on_ray = spec.cluster.launcher == "ray" and spec.train.faults.on_loss != "continue"
    return stop_channel("ray" if on_ray else "local", spec.run_dir)
