"""The allocator placing jobs from a prior, nothing measured first: a running job's own steps
correct its recipe's lines for every job of the recipe (`tasks.queue_pace.Units`): each kind's
line from the points its re-balancer wrote, and before any, the unit from its progress (a
pace, which restarts on a change of workers)."""

from __future__ import annotations

import os

import pytest

from hetflow.config import ClusterSpec
from hetflow.config.queue import QueueJob
from hetflow.queue.allocate import step_s
from hetflow.queue.jobs import Job, Line
from hetflow.tasks.queue import cluster_kinds, queue_model
from hetflow.tasks.queue_live import Live
from hetflow.tasks.queue_pace import Units
from hetflow.training.loop.progress import ProgressFile
from hetflow.training.loop.stop_channel import FileStopChannel

CLUSTER = ClusterSpec.from_speeds(["t4", "a100"])
WORKERS, KINDS = cluster_kinds(CLUSTER)
PRIOR = {"preset-t4": Line(0.002, 0.0004), "preset-a100": Line(0.001, 0.0001)}  # the prior's unit


def live(units: Units, name: str, recipe: str, workers: list[str], prior: bool = True) -> Live:
    """A job admitted (from the prior where `prior`) and running on `workers` (none: waiting)."""
    job = QueueJob(name=name, recipe=recipe, global_batch=64, steps=100)
    j = Live(job, units.admit(job, queue_model(job, PRIOR), prior), 0.0)
    j.workers, j.future = list(workers), object() if workers else None
    return j


def kinds_of(names):
    return [KINDS[WORKERS[w]] for w in names]


def paced(units: Units, jobs, samples, settled=lambda j: True, points=None) -> list[bool]:
    """`units.observe` at each (step, time) of the first job's progress, its points.json
    holding `points` (None: none written)."""
    out = []
    for s in samples:
        how = (lambda j, s=s: s, lambda j: points, kinds_of, WORKERS, settled, s[1])
        out.append(units.observe(jobs, *how))
    return out


def test_a_jobs_steps_scale_its_recipes_prior_lines_to_seconds():
    units = Units()
    low = live(units, "low", "digits-cnn", ["w0-t4", "w1-a100"])
    other = live(units, "normal", "digits-cnn", [])  # waiting, same recipe
    apart = live(units, "mlp", "digits-mlp", [])  # another recipe: its own unit
    before = step_s(low.model, kinds_of(low.workers))
    # first seen at step 1, timed from step 3 (two skipped), four steps of 0.25 s each
    seen = [(1, 10.0), (2, 10.9), (3, 11.0), (5, 11.5), (7, 12.0)]
    assert paced(units, [low, other, apart], seen) == [False] * 4 + [True]
    factor = 0.25 / before
    assert step_s(low.model, kinds_of(low.workers)) == pytest.approx(0.25)
    assert other.model.lines["preset-t4"].per_sample_s == pytest.approx(0.0004 * factor)
    assert apart.model.lines == PRIOR and units.learned["digits-mlp"].pace is None
    assert units.found == [{"job": "low", "at_s": 12.0, "step_s": 0.25, "on": ["w0-t4", "w1-a100"]}]
    # a job of the recipe admitted later is in seconds at once; one from the history as it is
    late = live(units, "late", "digits-cnn", [])
    assert late.model.lines["preset-a100"].fixed_s == pytest.approx(0.001 * factor)
    kept = Job("h", "low", 64, 10, 1.0, dict(PRIOR))
    kept_job = QueueJob(name="h", recipe="digits-cnn", global_batch=64, steps=10)
    assert units.admit(kept_job, kept, False) is kept and "h" not in units.priors


def test_each_kind_a_job_ran_on_gets_the_line_its_points_fit_and_the_others_are_scaled():
    """Two t4 points and one a100 point: the t4's line through them, the a100's proportional;
    a kind no job ran on (the v100 of a job's prior) scaled by the median ratio of the
    measured lines to the prior's; then the job's whole step, paced, scales every line."""
    units = Units()
    low = live(units, "low", "digits-cnn", ["w0-t4", "w1-a100"])
    points = (4, {"w0-t4": {16: 0.1, 48: 0.26}, "w1-a100": {16: 0.016}})
    assert paced(units, [low], [(1, 0.0)], points=points) == [True]
    lines = units.learned["digits-cnn"].lines
    assert lines["preset-t4"].fixed_s == pytest.approx(0.02)
    assert lines["preset-t4"].per_sample_s == pytest.approx(0.005)
    assert lines["preset-a100"] == Line(0.0, 0.001)
    assert low.model.lines == lines
    assert [f["kind"] for f in units.found] == ["preset-a100", "preset-t4"]
    # the same points again: nothing new; a waiting job with a third kind in its prior
    assert paced(units, [low], [(2, 0.5)], points=points) == [False]
    prior = dict(PRIOR) | {"preset-v100": Line(0.0, 0.0002)}
    job = QueueJob(name="v", recipe="digits-cnn", global_batch=64, steps=10)
    model = units.admit(job, queue_model(job, prior), True)
    # at the job's share (64 over 3 kinds: 21), t4 0.125/0.0104, a100 0.021/0.0031: median 8.7
    ratios = sorted([(0.02 + 0.005 * 21) / (0.002 + 0.0004 * 21), 0.021 / (0.001 + 0.0001 * 21)])
    median = sum(ratios) / 2
    assert model.lines["preset-v100"].per_sample_s == pytest.approx(0.0002 * median)
    assert model.lines["preset-t4"] == lines["preset-t4"]
    # the points are compute alone: low's whole step, paced, sets the level; the ratios stay
    # (first seen at step 1 above, so timed from step 5: six steps in 0.5 s)
    seen = [(5, 1.0), (7, 1.1), (11, 1.5)]
    assert paced(units, [low], seen, points=points) == [False, False, True]
    assert step_s(low.model, kinds_of(low.workers)) == pytest.approx(0.5 / 6, rel=1e-3)
    t4, a100 = low.model.lines["preset-t4"], low.model.lines["preset-a100"]
    assert t4.per_sample_s / a100.per_sample_s == pytest.approx(5.0)


def test_a_pace_starts_again_when_the_jobs_workers_change_or_one_still_joins():
    units = Units()
    low = live(units, "low", "digits-cnn", ["w0-t4", "w1-a100"])
    assert paced(units, [low], [(1, 0.0), (3, 1.0), (5, 2.0)]) == [False] * 3
    low.workers = ["w1-a100"]  # gave the t4 up: timed afresh on the a100 alone, from two steps on
    assert paced(units, [low], [(6, 2.5), (7, 2.6), (8, 2.7)]) == [False] * 3
    joining = paced(units, [low], [(9, 3.0), (13, 4.0)], settled=lambda j: False)
    assert joining == [False, False]
    assert paced(units, [low], [(14, 5.0), (16, 5.2), (17, 5.3), (21, 5.7)]) == [False] * 3 + [True]
    assert units.found[0]["step_s"] == pytest.approx(0.1)
    # the unit set, the job paces no more
    assert paced(units, [low], [(22, 6.0), (30, 7.0), (40, 8.0)]) == [False] * 3


def test_a_job_from_the_history_or_not_running_is_never_paced():
    units = Units()
    kept = live(units, "kept", "digits-cnn", ["w0-t4"], prior=False)
    waiting = live(units, "waiting", "digits-cnn", [])
    seen = [(1, 0.0), (3, 1.0), (5, 2.0), (7, 3.0), (9, 4.0), (11, 5.0)]
    assert not any(paced(units, [kept, waiting], seen))
    assert all(v.pace is None for v in units.learned.values()) and kept.model.lines == PRIOR


def test_the_progress_is_timed_when_rank_0_wrote_it(tmp_path):
    channel = FileStopChannel(tmp_path)
    assert channel.progress_at() is None
    ProgressFile(tmp_path / "progress.json", 7)
    os.utime(tmp_path / "progress.json", (1000.0, 1000.0))
    assert channel.progress_at() == (7, 1000.0)
