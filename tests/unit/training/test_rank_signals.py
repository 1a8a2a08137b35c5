"""A rank ended from outside by a signal is not a rank's own error: its record says
'signalled', which does not end the job as fatal (the launcher sees a killed rank, and torchrun
or Prefect restarts it); and a rank forked from the warm agent answers signals as a fresh
interpreter does, not with the agent's handlers."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

from torch.distributed.elastic.multiprocessing.api import SignalException

from hetflow.training.faults.records import failure_kind, write_failure
from hetflow.training.faults.watch import JobWatch


def test_a_signal_is_signalled_and_not_fatal_while_a_ranks_own_error_is(tmp_path):
    watch = JobWatch(tmp_path, stall_timeout_s=10)
    for exc in (KeyboardInterrupt(), SignalException("got signal: 2", signal.SIGINT)):
        assert failure_kind(exc) == "signalled"
    write_failure(tmp_path, 2, SignalException("got signal: 2", signal.SIGINT))
    assert [f.kind for f in watch.failures()] == ["signalled"]
    assert watch.fatal() is None
    write_failure(tmp_path, 1, ValueError("the recipe broke"))
    assert watch.fatal().rank == 1


def test_a_forked_rank_gets_a_fresh_interpreters_signal_handlers():
    """The agent's torchelastic handlers are installed, then `forked_main` runs (its `start`
    replaced by a probe of the handlers it finds): SIGTERM is the system's default again and
    SIGINT raises KeyboardInterrupt."""
    code = textwrap.dedent(
        """
        import signal
        from torch.distributed.elastic.multiprocessing.api import _terminate_process_handler
        from hetflow.training import worker

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(sig, _terminate_process_handler)
        seen = {}
        worker.start = lambda argv: seen.update(
            {s.name: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
        )
        worker.forked_main("--job", "x")
        assert seen["SIGTERM"] is signal.SIG_DFL and seen["SIGHUP"] is signal.SIG_DFL, seen
        assert seen["SIGINT"] is signal.default_int_handler, seen
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
