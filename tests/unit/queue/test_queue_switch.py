"""The switch rule's choice when jobs arrive while an elastic job runs on the workers they
want (pure): the session's situation of `hetflow bench queue --real`, three `digits-cnn`
jobs of three classes on one worker of each of three kinds, built as the session builds it
(`tasks.queue_session.Session.allocate`): each job's step-time line per kind, `low` running
on the workers the allocator gave it alone, a few steps in, `normal` and `high` arriving."""

from __future__ import annotations

import pytest

from hetflow.queue.allocate import allocate, objective, step_s
from hetflow.queue.jobs import Job, Kind, Line
from hetflow.queue.switch import InPlace, decide, net

KINDS = {"t4": Kind("t4", 16), "v100": Kind("v100", 16), "a100": Kind("a100", 80)}
WORKERS = {"w0": "t4", "w1": "v100", "w2": "a100"}
# Lines shaped like a profile of the emulated presets at batch 64: the slow kind's fixed cost
# above what the two fast ones step the batch in together, so a job alone leaves it idle.
LINES = {"t4": Line(0.25, 0.002), "v100": Line(0.12, 0.001), "a100": Line(0.12, 0.0005)}
SWITCH_S, IN_PLACE_S, EVERY, AT = 20.0, 1.0, 32, 5  # relaunch, move in place, steps


def digits(name: str, priority: str, steps: int) -> Job:
    return Job(name, priority, 64, steps, 0.1, dict(LINES), 0.0, EVERY)


JOBS = [digits("low", "low", 160), digits("normal", "normal", 160), digits("high", "high", 80)]


def situation(at: int = AT):
    """(running, left_s, in_place) for `low` at step `at` on the workers it gets alone."""
    running = allocate(JOBS[:1], WORKERS, KINDS)
    step = step_s(JOBS[0], [KINDS[WORKERS[w]] for w in running["low"]])
    until = {"low": (EVERY - at) * step}  # to the checkpoint a stop asks for
    in_place = InPlace(frozenset(j.name for j in JOBS), IN_PLACE_S, until)
    return running, {"low": (JOBS[0].steps - at) * step}, in_place


def test_the_situation_low_alone_leaves_the_slow_kind_idle():
    running, _, _ = situation()
    assert running == {"low": ["w1", "w2"]}


def test_the_candidates_priced_every_move_in_place_beats_the_stop():
    """Every candidate the rule could weigh: keep, the allocation over everything (`low`
    wholly on the slow worker: in place, it grows onto it and then lets its two go), `low`
    stopped off every worker, and `low` kept on one of its own workers (a shrink in place).
    By the rule's own pricing (`net`: the objective's rise over the horizon from the slowest
    switch on, less the switches), both moves in place are worth more than the stop, and
    the allocation over everything more in place than relaunched."""
    running, left, in_place = situation()
    keep = allocate(JOBS, WORKERS, KINDS, fixed=running)
    candidates = {
        "across": {"low": ["w0"], "normal": ["w1"], "high": ["w2"]},
        "stop": {"low": [], "normal": ["w1"], "high": ["w2"]},
        "kept": {"low": ["w1"], "normal": ["w0"], "high": ["w2"]},
    }
    assert allocate(JOBS, WORKERS, KINDS, held=running) == candidates["across"]
    horizon = min(left.values())

    def worth(x, how=in_place):
        return net(JOBS, running, keep, x, WORKERS, KINDS, SWITCH_S, horizon, how)

    assert min(worth(candidates["across"]), worth(candidates["kept"])) > worth(candidates["stop"])
    assert worth(candidates["stop"]) > 0
    rigid = InPlace(frozenset(), IN_PLACE_S, in_place.until_stop_s)
    assert worth(candidates["across"], rigid) < worth(candidates["across"])
    assert objective(JOBS, candidates["stop"], WORKERS, KINDS) < objective(
        JOBS, candidates["across"], WORKERS, KINDS
    )


@pytest.mark.parametrize("at", [0, AT, EVERY - 3])
def test_low_moves_in_place_rather_than_stop_at_its_checkpoint(at):
    """The session's call: `low` keeps a worker and moves in place (none of the jobs it
    changes relaunches); `normal` and `high` each get a worker; it was stopped off every
    worker."""
    running, left, in_place = situation(at)
    got = decide(JOBS, dict(running), running, left, WORKERS, KINDS, SWITCH_S, True, in_place)
    assert got["low"] and got["normal"] and got["high"]
    assert in_place.relaunched(running, got) == []


def test_not_elastic_low_is_relaunched_as_before():
    """Without moves in place the rule is unchanged: `low` moves by a relaunch (or stop)."""
    running, left, in_place = situation()
    rigid = InPlace(frozenset(), IN_PLACE_S, in_place.until_stop_s)
    got = decide(JOBS, dict(running), running, left, WORKERS, KINDS, SWITCH_S, True, rigid)
    assert not set(got["low"]) & set(running["low"])
    assert got["high"] == ["w2"]


def test_a_kept_worker_stays_with_its_job_and_it_may_grow():
    """`kept`: the job starts with it before the arrivals pick, no exchange takes it, and the
    job may take more; without it, the higher classes pick `low`'s workers first."""
    low, normal, _ = JOBS
    got = allocate(JOBS, WORKERS, KINDS, kept={"low": ["w2"]})
    assert "w2" in got["low"] and got["high"] and got["normal"]
    grown = allocate([low, normal], WORKERS, KINDS, kept={"low": ["w0"]})
    assert "w0" in grown["low"]
    assert allocate(JOBS, WORKERS, KINDS)["low"] == ["w0"]


def test_two_elastic_jobs_each_keep_one_of_their_own():
    """Two running elastic jobs, a high one arriving: each kept on some of its own workers
    (the search over which one each keeps goes job by job)."""
    six = {"a0": "a100", "a1": "a100", "v0": "v100", "v1": "v100", "t0": "t4", "t1": "t4"}
    running = {"low": ["a0", "v0", "t0"], "normal": ["a1", "v1", "t1"]}
    left = {"low": 100.0, "normal": 100.0}
    in_place = InPlace(frozenset({"low", "normal"}), IN_PLACE_S, {"low": 5.0, "normal": 5.0})
    got = decide(JOBS, dict(running), running, left, six, KINDS, SWITCH_S, True, in_place)
    assert got["high"]
    for name, names in running.items():
        assert set(got[name]) & set(names), (name, got)


def test_a_kept_worker_never_makes_a_higher_class_wait():
    """Two workers, `low` running elastic on both, `normal` and `high` arriving: keeping
    `low` on one would leave one of them waiting behind a lower class; both get one."""
    two = {"w1": "v100", "w2": "a100"}
    running = {"low": ["w1", "w2"]}
    in_place = InPlace(frozenset({"low"}), IN_PLACE_S, {"low": 60.0})  # a long wait to stop
    got = decide(JOBS, dict(running), running, {"low": 600.0}, two, KINDS, SWITCH_S, True, in_place)
    assert got["high"] and got["normal"] and not got["low"]


def test_a_stop_is_charged_its_relaunch_as_a_move_is():
    """A running job moved to no worker restarts later: its relaunch is charged at the
    throughput it has now (here all it gets alone: normalised 1), not priced at nothing."""
    from hetflow.queue.switch import switch_cost

    running, _, _ = situation()
    stop = {"low": [], "normal": ["w1"], "high": ["w2"]}
    charged = switch_cost(JOBS, running, stop, WORKERS, KINDS, SWITCH_S)
    assert charged == pytest.approx(JOBS[0].weight * 1.0 * SWITCH_S)
