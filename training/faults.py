"""What a rank does when something goes wrong: it records why it stopped, checkpoints and exits
on SIGTERM (preemption), checks the gradient for NaN/Inf, and never waits in a collective for
longer than the job's stall timeout.

A rank writes, under RUN_DIR/ranks/attempt-A/ (A: torchrun's restart count), where the launcher
reads them (`hetflow.training.watch`)::

    rank1.pid             its process id, at start
    rank1.failure.json    a `RankFailure`, when it exits on an exception

The first 'error' or 'nonfinite' record ends the job at once: an exception in the rank's own
code is deterministic and not worth torchrun's restarts.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from hetflow.records import LOCAL_SGD, CompressionMethod, FailureKind, RankFailure

# Until the training loop starts (rendezvous, data, the model's broadcast), a collective may
# wait this long: ranks load their shards at different speeds. In the loop: the stall timeout.
STARTUP_TIMEOUT_S = 300.0
# Exit status of a rank that checkpointed on SIGTERM: non-zero, so that torchrun restarts.
PREEMPTED_EXIT = 143
# Consecutive skipped steps (nonfinite='skip') after which the run fails: the state is broken.
MAX_SKIPPED_IN_A_ROW = 10
TRACEBACK_LINES = 8

_STEP: dict[str, int | None] = {"now": None}  # the step this process's loop is in


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
    raises a plain RuntimeError naming its transport), 'nonfinite', else 'error'."""
    if isinstance(exc, NonFiniteGradient):
        return "nonfinite"
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
        step=_STEP["now"],
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


def bound_collectives(timeout_s: float) -> None:
    """Every process group this rank is in (DDP's, the control groups, subgroups) times out a
    collective after `timeout_s`: a stalled peer is noticed, never waited for 30 minutes.
    `torch.distributed` sets a timeout per group at creation only; `_set_pg_timeout` resets it."""
    from torch.distributed.distributed_c10d import _rank_not_in_group, _set_pg_timeout, _world

    for group in list(_world.pg_map):
        if not _rank_not_in_group(group):
            _set_pg_timeout(timedelta(seconds=timeout_s), group)


class Preemption:
    """SIGTERM (a spot instance's notice) makes every rank stop at the same step boundary.

    The rank that got the signal writes `stop_at` = its next step boundary + slack into
    torchrun's store (first writer wins); every rank reads the store at each boundary (one
    round trip, ~20 us: no collective per step, docs/measurements.md) and stops at `stop_at`.
    That is the same boundary for all: a rank cannot finish step b+1 before the signalled rank,
    at boundary b, has written and joined step b+1's all-reduce. Local SGD lets ranks run up to
    H steps apart, hence the slack. A second SIGTERM kills at once (the default action).
    """

    KEY = "stop_at"

    def __init__(self, slack: int = 1) -> None:
        from torch.distributed.distributed_c10d import _get_default_store

        self.store = dist.PrefixStore(f"hetflow/preempt_{attempt()}/", _get_default_store())
        self.slack, self.signalled, self.stop_at = slack, False, None
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)
        # else: a Ray Train worker (its training function runs in a thread of its own), whose
        # SIGTERM is Ray's to handle: the group restarts from the last checkpoint

    def _on_sigterm(self, signum, frame) -> None:
        self.signalled = True
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def stop_here(self, boundary: int) -> bool:
        """At `boundary` (steps done): True when every rank stops here to checkpoint."""
        if self.stop_at is None:
            if self.signalled:
                mine = str(boundary + self.slack).encode()
                self.stop_at = int(self.store.compare_set(self.KEY, b"", mine))
            elif self.store.check([self.KEY]):
                self.stop_at = int(self.store.get(self.KEY))
        return self.stop_at is not None and boundary >= self.stop_at


class FiniteGuard:
    """The optimizer, stepping only on a finite gradient: on NaN/Inf it raises
    `NonFiniteGradient` naming the step ('fail') or skips the step ('skip').

    It checks the all-reduced gradient, the same on every rank (the methods that do not
    all-reduce every step refuse 'skip': `check_job`), so every rank decides alike.
    Everything else is the wrapped optimizer's.
    """

    def __init__(self, opt, mode: str) -> None:
        self.opt, self.mode = opt, mode
        self.skipped = self.in_a_row = 0
        self.last_skipped = False

    def __getattr__(self, name: str):
        return getattr(self.opt, name)

    def step(self, *args, **kwargs):
        grads = [p.grad for g in self.opt.param_groups for p in g["params"] if p.grad is not None]
        self.last_skipped = False
        if not grads or bool(torch.isfinite(nn.utils.get_total_norm(grads))):
            self.in_a_row = 0
            return self.opt.step(*args, **kwargs)
        step = _STEP["now"]
        if self.mode == "fail":
            raise NonFiniteGradient(f"step {step}: the gradient is NaN/Inf (nonfinite='fail')")
        self.skipped, self.in_a_row, self.last_skipped = self.skipped + 1, self.in_a_row + 1, True
        if self.in_a_row >= MAX_SKIPPED_IN_A_ROW:
            raise NonFiniteGradient(f"step {step}: {self.in_a_row} non-finite steps in a row")
        return None


class StepGuard:
    """The training loop's step boundary: notes the step, fires injected faults (tests), bounds
    the collectives, guards the optimizer, and tells when every rank stops for a SIGTERM."""

    def __init__(self, spec, rank: int, net) -> None:
        method: CompressionMethod | None = spec.plan.compression
        local = method is not None and method.name in LOCAL_SGD
        if local and spec.train.nonfinite == "skip":
            raise ValueError(
                f"train.nonfinite: 'skip' needs the gradient all-reduced every step, "
                f"which {method.name} does not do; use 'fail'"
            )
        net.opt = self.opt = FiniteGuard(net.opt, spec.train.nonfinite)
        self.preemption = Preemption(slack=1 + (method.period or 0) if local else 1)
        self.injected = {(f.step, f.kind) for f in spec.inject if f.rank == rank}
        self.model = net.model
        bound_collectives(spec.train.stall_timeout_s)

    def begin(self, step: int) -> None:
        _STEP["now"] = step
        for kind in ("raise", "nan"):
            if (step, kind) in self.injected:
                _inject_once(self.model, kind, step)

    def end(self, rec, boundary: int) -> bool:
        """Mark `rec` skipped if its step was; True when every rank stops at `boundary`."""
        rec.skipped = self.opt.last_skipped
        return self.preemption.stop_here(boundary)


def _inject_once(model: nn.Module, kind: str, step: int) -> None:
    """For tests (`RunSpec.inject`): the model's next forward raises, as a bug in a recipe
    would, or returns NaN."""
    handles = []

    def hook(module, args, output):
        handles.pop().remove()
        if kind == "raise":
            raise RuntimeError(f"injected fault at step {step}")
        return output * float("nan")

    handles.append(model.register_forward_hook(hook))
