"""The step boundary of a rank: it checks the gradient for NaN/Inf, checkpoints and exits on
SIGTERM (preemption) at the same step as every other rank, and never waits in a collective for
longer than the job's stall timeout."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from hetflow.records import LOCAL_SGD, CompressionMethod
from hetflow.training.faults.inject import install_injections
from hetflow.training.faults.records import STEP, NonFiniteGradient, attempt

# Consecutive skipped steps (nonfinite='skip') after which the run fails: the state is broken.
MAX_SKIPPED_IN_A_ROW = 10


class SkipCount:
    """Steps skipped for a NaN/Inf gradient: `last` (the latest step was), `in_a_row` and
    `total`; `MAX_SKIPPED_IN_A_ROW` in a row raise `NonFiniteGradient`, saying `why`."""

    def __init__(self) -> None:
        self.last, self.in_a_row, self.total = False, 0, 0

    def note(self, skipped: bool, why: Callable[[int], str]) -> None:
        self.last = skipped
        self.in_a_row = self.in_a_row + 1 if skipped else 0
        self.total += skipped
        if self.in_a_row >= MAX_SKIPPED_IN_A_ROW:
            raise NonFiniteGradient(why(self.in_a_row))


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
    round trip, no collective per step: docs/measurements/loop.md) and stops at `stop_at`.
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
        self.skips = SkipCount()

    @property
    def last_skipped(self) -> bool:
        return self.skips.last

    def __getattr__(self, name: str):
        return getattr(self.opt, name)

    def step(self, *args, **kwargs):
        grads = [p.grad for g in self.opt.param_groups for p in g["params"] if p.grad is not None]
        if not grads or bool(torch.isfinite(nn.utils.get_total_norm(grads))):
            self.skips.note(False, str)
            return self.opt.step(*args, **kwargs)
        step = STEP["now"]
        if self.mode == "fail":
            raise NonFiniteGradient(f"step {step}: the gradient is NaN/Inf (nonfinite='fail')")
        self.skips.note(True, lambda n: f"step {step}: {n} non-finite steps in a row")
        return None


class StepGuard:
    """The training loop's step boundary: notes the step, bounds the collectives, guards the
    optimizer, and tells when every rank stops for a SIGTERM. Faults a test injects
    (`RunSpec.inject`) are hooks on the model, installed here once: none in the step path."""

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
        install_injections(net.model, [f for f in spec.inject if f.rank == rank], STEP)
        bound_collectives(spec.train.stall_timeout_s)

    def begin(self, step: int) -> None:
        STEP["now"] = step

    def end(self, rec, boundary: int) -> bool:
        """Mark `rec` skipped if its step was; True when every rank stops at `boundary`."""
        rec.skipped = self.opt.last_skipped
        return self.preemption.stop_here(boundary)
