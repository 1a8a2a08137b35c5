"""The allocator placing jobs from a prior, nothing measured first: a running job's own steps,
read from its run's progress file, put the prior's lines in seconds for every job of its
recipe (`tasks.queue_pace.Units`), and a pace restarts on a change of workers."""

from __future__ import annotations

import os

import pytest

from hetflow.config import ClusterSpec
from hetflow.config.queue import QueueJob
from hetflow.queue.allocate import step_s
from hetflow.queue.jobs import Job, Line
from hetflow.tasks.queue import cluster_kinds, queue_model
from hetflow.tasks.queue_pace import Units
from hetflow.tasks.queue_session import Live
from hetflow.training.loop.progress import ProgressFile
from hetflow.training.loop.stop_channel import FileStopChannel

CLUSTER = ClusterSpec.from_speeds(["t4", "a100"])
WORKERS, KINDS = cluster_kinds(CLUSTER)
PRIOR = {"preset-t4": Line(0.002, 0.0004), "preset-a100": Line(0.001, 0.0001)}  # the prior's unit


def live(name: str, recipe: str, workers: list[str], prior: bool = True) -> Live:
    job = QueueJob(name=name, recipe=recipe, global_batch=64, steps=100)
    j = Live(job, queue_model(job, PRIOR), 0.0, prior=prior)
    j.workers, j.future = list(workers), object()  # running
    return j


def kinds_of(names):
    return [KINDS[WORKERS[w]] for w in names]


def paced(units: Units, jobs, samples, settled=lambda j: True) -> list[bool]:
    """`units.observe` at each (step, time) of the first job's progress."""
    out = []
    for s in samples:
        out.append(units.observe(jobs, lambda j, s=s: s, kinds_of, settled, s[1]))
    return out


def test_a_jobs_steps_scale_its_recipes_prior_lines_to_seconds():
    low = live("low", "digits-cnn", ["w0-t4", "w1-a100"])
    other = live("normal", "digits-cnn", [], prior=True)  # waiting, same recipe
    apart = live("mlp", "digits-mlp", [], prior=True)  # another recipe: its own unit
    units = Units()
    before = step_s(low.model, kinds_of(low.workers))
    # first seen at step 1, timed from step 3 (two skipped), four steps of 0.25 s each
    seen = [(1, 10.0), (2, 10.9), (3, 11.0), (5, 11.5), (7, 12.0)]
    assert paced(units, [low, other, apart], seen) == [False] * 4 + [True]
    factor = units.factors["digits-cnn"]
    assert factor == pytest.approx(0.25 / before)
    assert step_s(low.model, kinds_of(low.workers)) == pytest.approx(0.25)
    assert not low.prior and not other.prior and apart.prior
    assert other.model.lines["preset-t4"].per_sample_s == pytest.approx(0.0004 * factor)
    assert apart.model.lines == PRIOR
    assert units.found == [{"job": "low", "at_s": 12.0, "step_s": 0.25, "factor": factor}]
    # a job of the recipe admitted later is in seconds at once
    model, prior = units.admit(
        apart.job.model_copy(update={"recipe": "digits-cnn"}), apart.model, True
    )
    assert not prior and model.lines["preset-a100"].fixed_s == pytest.approx(0.001 * factor)
    # and one from the history is not scaled
    kept = Job("h", "low", 64, 10, 1.0, dict(PRIOR))
    assert units.admit(low.job, kept, False) == (kept, False)


def test_a_pace_starts_again_when_the_jobs_workers_change_or_one_still_joins():
    low = live("low", "digits-cnn", ["w0-t4", "w1-a100"])
    units = Units()
    assert paced(units, [low], [(1, 0.0), (3, 1.0), (5, 2.0)]) == [False] * 3
    low.workers = ["w1-a100"]  # gave the t4 up: timed afresh on the a100 alone, from two steps on
    assert paced(units, [low], [(6, 2.5), (7, 2.6), (8, 2.7)]) == [False] * 3
    joining = paced(units, [low], [(9, 3.0), (13, 4.0)], settled=lambda j: False)
    assert joining == [False, False]
    assert paced(units, [low], [(14, 5.0), (16, 5.2), (17, 5.3), (21, 5.7)]) == [False] * 3 + [True]
    assert units.found[0]["step_s"] == pytest.approx(0.1)


def test_a_job_from_the_history_or_not_running_is_never_paced():
    kept = live("kept", "digits-cnn", ["w0-t4"], prior=False)
    waiting = live("waiting", "digits-cnn", [])
    waiting.future = None
    units = Units()
    seen = [(1, 0.0), (3, 1.0), (5, 2.0), (7, 3.0), (9, 4.0), (11, 5.0)]
    assert not any(paced(units, [kept, waiting], seen))
    assert units.factors == {} and kept.model.lines == PRIOR


def test_the_progress_is_timed_when_rank_0_wrote_it(tmp_path):
    channel = FileStopChannel(tmp_path)
    assert channel.progress_at() is None
    ProgressFile(tmp_path / "progress.json", 7)
    os.utime(tmp_path / "progress.json", (1000.0, 1000.0))
    assert channel.progress_at() == (7, 1000.0)
