"""A job past its launcher's deadline says where its processes were: the launcher asks each
for its stacks (`faults.watch.dump_stacks`) before it kills them, and the error carries them.
Real processes: an agent that starts a rank, as torchrun does, both stuck."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from hetflow.training.faults.watch import JobWatch, kill_job
from hetflow.training.launch.local import _watch
from hetflow.training.launch.outcome import LaunchError

RANK = textwrap.dedent(
    """
    import time
    from hetflow.training.faults.watch import dump_on_signal

    def stuck_in_a_collective():
        time.sleep(120)

    dump_on_signal()
    print("rank ready", flush=True)
    stuck_in_a_collective()
    """
)
AGENT = textwrap.dedent(
    f"""
    import subprocess, sys, time
    from hetflow.training.faults.watch import dump_on_signal

    dump_on_signal()
    subprocess.Popen([sys.executable, "-c", {RANK!r}])
    time.sleep(120)
    """
)


@pytest.mark.parametrize("agent", [False, True], ids=["ranks", "warm-agent"])
def test_a_job_past_its_deadline_leaves_each_stack_in_the_error(tmp_path, agent):
    log = tmp_path / "workers.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", AGENT], stdout=out, stderr=subprocess.STDOUT)
    try:
        for _ in range(300):  # the rank has registered its handler
            if "rank ready" in log.read_text():
                break
            time.sleep(0.1)
        with pytest.raises(LaunchError, match="past its deadline") as err:
            _watch(proc, JobWatch(tmp_path, 60.0), tmp_path, time.perf_counter(), None, agent)
    finally:
        kill_job(proc.pid)
        proc.wait()
    text = str(err.value)
    assert "in stuck_in_a_collective" in text, text  # the rank's own frame, by name
    # one stack a process asked: the rank's, and the agent's where it registered too
    assert text.count("most recent call first") == 1 + agent, text
