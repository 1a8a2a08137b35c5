"""A rank's launch by phase: when its process started and when each part of its start-up ended,
from the job's submit to its first step (`records.StartupPhases`).

Imports nothing but the standard library: the worker's entry (`training.worker`) imports it
first, so that its own import is not counted in the phase it measures.

The phases follow one another, each from the end of the one before:

- spawn: the submit (`RunSpec.submitted_at`) to this process's start (the launcher: torchrun
  starts, imports torch and forks this process), or, for a warm worker started ahead of the
  job (`elastic.warm`), to its assignment (`HETFLOW_ASSIGNED_AT`);
- import: the process's start to the entry's `main` (the interpreter, torch and hetflow);
- rendezvous: to the process group's existence (the job read, the rank placed, the group);
- data: to the rank's data opened (the manifest, the host's shard cache);
- model: to the training loop built (the model, DDP, the optimizer, the resumed checkpoint),
  less 'auto''s compression trials, which the timeline keeps as `trials_s`;
- first_step: to the first step's start (its batch read and one untimed pass: the warm-up).
"""

from __future__ import annotations

import os
import time

# the phases' ends, in order, as `StartupMarks.mark` names them
MARKS = ("import", "rendezvous", "data", "model")


def process_started_at() -> float | None:
    """This process's start (its exec, or its fork), as `time.time()`: Linux's /proc gives it
    in clock ticks since boot, read here against the boot-time clock now (to 1/CLK_TCK s; the
    boot time /proc/stat gives is whole seconds, too coarse). None where /proc does not say."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        ticks = int(fields[19])  # field 22, counted from the state (field 3)
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return time.time() - max(0.0, age)


# at this module's import: the entry's first line, where /proc does not give the start
_FIRST_LINE = time.time()


class StartupMarks:
    """The times (`time.time()`) at which this rank's start-up phases ended, marked as it goes.

    `started` is the process's start (`process_started_at`, else the first line of the
    entry), or a warm worker's assignment, the end of its wait (`HETFLOW_ASSIGNED_AT`);
    `mark(name)` records the end of the phase `name` (one of `MARKS`); `phases` turns them
    into seconds per phase once the first step's start is known."""

    def __init__(self) -> None:
        assigned = os.environ.get("HETFLOW_ASSIGNED_AT")
        self.started = float(assigned) if assigned else process_started_at() or _FIRST_LINE
        self.at: dict[str, float] = {}

    def mark(self, name: str) -> None:
        if name not in MARKS:
            raise ValueError(f"unknown start-up phase {name!r}; one of {MARKS}")
        self.at[name] = time.time()

    def phases(self, submitted_at: float, first_step_s: float, trials_s: float):
        """Each phase's seconds, `first_step_s` and `trials_s` being the timeline's (seconds
        since `submitted_at`). A phase not marked (a launcher that marks fewer) is 0, its time
        counted in the next one marked. They add up to `first_step_s` less `trials_s`.

        >>> m = StartupMarks(); m.started = 101.0
        >>> m.at = {"import": 103.0, "rendezvous": 103.5, "data": 104.0, "model": 106.0}
        >>> p = m.phases(100.0, first_step_s=7.0, trials_s=1.0)
        >>> p.spawn_s, p.import_s, p.rendezvous_s, p.data_s, p.model_s, p.first_step_s
        (1.0, 2.0, 0.5, 0.5, 1.0, 1.0)
        """
        from hetflow.records import StartupPhases  # pydantic: not before the first mark

        ends = [self.started, *(self.at.get(n) for n in MARKS)]
        last, seconds = submitted_at, []
        for end in ends:
            seconds.append(max(0.0, end - last) if end is not None else 0.0)
            last = end if end is not None else last
        seconds[-1] = max(0.0, seconds[-1] - trials_s)  # the model's phase, less the trials
        first = max(0.0, submitted_at + first_step_s - last)
        names = ("spawn_s", "import_s", "rendezvous_s", "data_s", "model_s")
        return StartupPhases(**dict(zip(names, seconds, strict=True)), first_step_s=first)
