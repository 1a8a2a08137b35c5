"""Faults a test injects into a rank (`RunSpec.inject`): at a given step, the model's forward
raises, as a bug in a recipe would, or returns NaN, or the rank's process is killed (SIGKILL),
stopped (SIGSTOP) or sent SIGTERM mid-step, as a lost, stalled or preempted worker is."""

from __future__ import annotations

import os
import signal

from torch import nn


def install_injections(model: nn.Module, injections: list, step: dict) -> None:
    """Make `model`'s forward fire each injection (`.step`, `.kind`) once, at the step
    `step["now"]` names when it runs; no hook at all when there is none."""
    pending = {(f.step, f.kind) for f in injections}
    if not pending:
        return

    def hook(module, args, output):
        now = step["now"]
        if (now, "raise") in pending:
            pending.discard((now, "raise"))
            raise RuntimeError(f"injected fault at step {now}")
        for kind, sig in (
            ("kill", signal.SIGKILL),
            ("stop", signal.SIGSTOP),
            ("term", signal.SIGTERM),
        ):
            if (now, kind) in pending:
                pending.discard((now, kind))
                os.kill(os.getpid(), sig)
        if (now, "nan") in pending:
            pending.discard((now, "nan"))
            return output * float("nan")
        return output

    model.register_forward_hook(hook)
