"""What a rank leaves behind when something goes wrong, for the launcher to read.

A rank writes, under RUN_DIR/ranks/attempt-A/ (A: torchrun's restart count), where the launcher
reads them (`hetflow.training.faults.watch`)::

    rank1.pid             its process id, at start
    rank1.failure.json    a `RankFailure`, when it exits on an exception

The first 'error' or 'nonfinite' record ends the job at once: an exception in the rank's own
code is deterministic and not worth torchrun's restarts.
"""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path
from typing import Literal

import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, Field

# Until the training loop starts (rendezvous, data, the model's broadcast), a collective may
# wait this long: ranks load their shards at different speeds. In the loop: the stall timeout.
STARTUP_TIMEOUT_S = 300.0
# Exit status of a rank that checkpointed on SIGTERM: non-zero, so that torchrun restarts.
PREEMPTED_EXIT = 143
TRACEBACK_LINES = 8

STEP: dict[str, int | None] = {"now": None}  # the step this process's loop is in


FailureKind = Literal["error", "nonfinite", "peer_lost", "timed_out", "signalled"]


class RankFailure(BaseModel):
    """Why one rank of a torchrun job stopped, as it wrote it before exiting.

    `kind`: 'error', an exception in the rank's own code (a recipe, a shard, a CUDA error;
    deterministic, not worth a restart); 'nonfinite', a NaN/Inf gradient under
    `nonfinite='fail'`; 'peer_lost' and 'timed_out', a collective that failed because another
    rank died or stalled (torchrun restarts the group); 'signalled', ended from outside by a
    signal (its parent gone, a stop), handled as a killed rank is. `step` is the step it was
    in, if any.
    """

    model_config = ConfigDict(extra="forbid")

    rank: int
    attempt: int = Field(0, description="torchrun's restart count when it failed.")
    kind: FailureKind
    step: int | None = None
    exception: str = Field(description="The exception's type, e.g. 'RuntimeError'.")
    message: str
    traceback: list[str] = Field([], description="The traceback's last lines.")
    time: float = Field(description="time.time() when written: the first is the root cause.")

    def summary(self) -> str:
        """'rank 1 (step 3): RuntimeError: boom', then the traceback's last lines."""
        where = f"rank {self.rank}" + (f" (step {self.step})" if self.step is not None else "")
        return "\n".join([f"{where}: {self.exception}: {self.message}", *self.traceback])


def attempt() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def ranks_dir(run_dir: str | Path, attempt_no: int | None = None) -> Path:
    """RUN_DIR/ranks, or the folder of one attempt in it."""
    base = Path(run_dir) / "ranks"
    return base if attempt_no is None else base / f"attempt-{attempt_no}"


def write_pid(run_dir: str | Path, rank: int) -> None:
    folder = ranks_dir(run_dir, attempt())
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank{rank}.pid").write_text(str(os.getpid()))


def failure_kind(exc: BaseException) -> FailureKind:
    """'peer_lost' or 'timed_out' for a collective that failed because of another rank (gloo
    raises a plain RuntimeError naming its transport), 'nonfinite', 'signalled' for a rank
    ended from outside by SIGINT or a handler's exception for a signal (torchelastic's
    `SignalException`: a parent that died, a stop from the launcher; not the rank's own
    error, so not fatal to the job), else 'error'."""
    if isinstance(exc, NonFiniteGradient):
        return "nonfinite"
    if isinstance(exc, KeyboardInterrupt) or type(exc).__name__ == "SignalException":
        return "signalled"
    text = str(exc)
    if isinstance(exc, dist.DistError) or "gloo/transport" in text:
        return "timed_out" if "Timed out" in text or "timed out" in text else "peer_lost"
    return "error"


def write_failure(run_dir: str | Path, rank: int, exc: BaseException) -> RankFailure:
    """Record why this rank stops (written whole: a temporary name, then renamed)."""
    lines = traceback.format_exception(exc)
    tail = "".join(lines[:-1]).rstrip().splitlines()[-TRACEBACK_LINES:]
    failure = RankFailure(
        rank=rank,
        attempt=attempt(),
        kind=failure_kind(exc),
        step=STEP["now"],
        exception=type(exc).__name__,
        message=str(exc).strip().splitlines()[0][:500] if str(exc).strip() else "",
        traceback=tail,
        time=time.time(),
    )
    folder = ranks_dir(run_dir, failure.attempt)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".rank{rank}.failure.tmp"
    tmp.write_text(failure.model_dump_json())
    tmp.replace(folder / f"rank{rank}.failure.json")
    return failure


class Preempted(Exception):
    """Every rank checkpointed at `step` after a SIGTERM: exit for torchrun's restart."""

    def __init__(self, step: int) -> None:
        super().__init__(f"preempted (SIGTERM): checkpointed at step {step}")
        self.step = step


class NonFiniteGradient(RuntimeError):
    """The all-reduced gradient holds NaN or Inf (`nonfinite='fail'`)."""
