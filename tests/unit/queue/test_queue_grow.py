"""The session's choice for a running job whose workers change: in place (an elastic job that
keeps some of its workers gives the others up, `Moves.shrink`, and takes the new ones once they
are free, `Moves.grow`; one that keeps none takes its new ones first, then lets its own go) or
by a stop at its checkpoint and a relaunch. The launcher's handle is
outside the claim: `Moves` is replaced by a recorder that answers as a running job would."""

from __future__ import annotations

import pytest

from hetflow.config import ClusterSpec, DatasetSpec, TrackingConfig
from hetflow.config.queue import QueueJob
from hetflow.tasks import queue_session
from hetflow.tasks.queue_live import Live
from hetflow.tasks.queue_session import Session


class Recorder:
    """`Moves` as the session calls it: each shrink and grow recorded; `grows` answers what a
    grow of the job returns (None: not stepping yet; the workers added)."""

    cost_s = 1.0  # a move in place's measured cost, as the allocator prices it

    def __init__(self, grows=lambda added: list(added)) -> None:
        self.calls: list[tuple] = []
        self.grows = grows
        self.leaving: set[str] = set()
        self.joining: set[str] = set()  # grown onto, not yet in a generation

    def shrink(self, job, run_dir, old, new, now) -> bool:
        self.calls.append(("shrink", job, sorted(set(old) - set(new))))
        return True

    def grow(self, job, run_dir, added, limits, now):
        self.calls.append(("grow", job, sorted(added), sorted(set(limits.values()))))
        return self.grows(added)

    def busy(self) -> set[str]:
        return set(self.leaving)

    def pending(self, job) -> set[str]:
        return set(self.joining)


def new_session(tmp_path, monkeypatch, speeds: list[float], switch_s: float) -> Session:
    """A session on workers of `speeds`, run directories under `tmp_path`, its moves
    recorded (`Recorder`)."""
    monkeypatch.setattr(queue_session, "stable_run_dir", lambda name: tmp_path / name)
    s = Session(
        cluster=ClusterSpec.from_speeds(speeds, name=f"q{len(speeds)}"),
        dataset=DatasetSpec(url="s3://b/d"),
        tracking=TrackingConfig(),
        parent_run_id="p",
        switch_s=switch_s,
        inbox=list,
    )
    s.moves = Recorder()
    return s


@pytest.fixture
def session(tmp_path, monkeypatch):
    return new_session(tmp_path, monkeypatch, [1, 1, 1], switch_s=15.0)


def running(session: Session, name: str, workers: list[str], in_place=True) -> Live:
    """A job of `session` whose segment runs on `workers`, its run directory made."""
    job = QueueJob(name=name, steps=100, checkpoint_every=10, in_place=in_place)
    live = Live(job, None, 0.0, workers=list(workers), future=object())
    (queue_session.stable_run_dir(name)).mkdir(parents=True, exist_ok=True)
    session.jobs.append(live)
    return live


def test_an_elastic_job_grows_onto_a_free_worker_in_place(session):
    """No stop asked: the worker is started in its spare slot, under its kind's Prefect
    limit, and the job holds it from then on."""
    low = running(session, "low", ["w0"])
    low.target = ["w0", "w1"]
    assert session.in_place(low)
    assert session.moves.calls == [("grow", "low", ["w1"], ["hetflow-workers-speed-1"])]
    assert low.workers == ["w0", "w1"] and low.target is None and low.stop_at is None
    assert "w1" in low.joined


def test_a_grow_waits_for_a_worker_another_job_still_holds(session):
    """The worker is taken only once free (its other job's segment over, or its leave in
    place done); meanwhile the target stands and no stop is asked."""
    low = running(session, "low", ["w0"])
    high = running(session, "high", ["w1"], in_place=False)
    low.target = ["w0", "w1"]
    assert session.in_place(low)
    assert session.moves.calls == [] and low.target == ["w0", "w1"] and low.stop_at is None
    high.workers = []
    session.moves.leaving = {"w1"}  # leaving in place, its process not ended yet
    session.shrink_waiting()
    assert session.moves.calls == []
    session.moves.leaving = set()
    session.shrink_waiting()
    assert session.moves.calls == [("grow", "low", ["w1"], ["hetflow-workers-speed-1"])]
    assert low.workers == ["w0", "w1"] and low.target is None


def test_a_job_that_keeps_one_worker_gives_one_up_and_takes_another(session):
    low = running(session, "low", ["w0", "w1"])
    low.target = ["w1", "w2"]
    assert session.in_place(low)
    assert [c[:3] for c in session.moves.calls] == [
        ("shrink", "low", ["w0"]),
        ("grow", "low", ["w2"]),
    ]
    assert sorted(low.workers) == ["w1", "w2"] and low.target is None


def test_a_grow_is_asked_again_while_the_job_does_not_step(session):
    session.moves = Recorder(grows=lambda added: None)
    low = running(session, "low", ["w0"])
    low.target = ["w0", "w1"]
    assert session.in_place(low)
    assert low.workers == ["w0"] and low.target == ["w0", "w1"] and low.stop_at is None


def test_a_worker_with_no_spare_slot_relaunches_the_job(session):
    """The launcher had no slot that fits it (`Moves.grow` added none): the job is asked to
    stop at its next checkpoint, and its next segment starts on the whole target."""
    session.moves = Recorder(grows=lambda added: [])
    low = running(session, "low", ["w0"])
    low.target = ["w0", "w1"]
    assert session.in_place(low)
    assert low.stop_at == 10 and low.target == ["w0", "w1"]


@pytest.mark.parametrize(
    "in_place, workers, target",
    [
        (False, ["w0"], ["w0", "w1"]),  # not elastic: a grow relaunches it
        (True, ["w0"], ["w1"]),  # keeps none of its workers, not free to move across
        (True, ["w0"], []),  # gives every worker up: a stop
    ],
)
def test_a_move_that_cannot_be_made_in_place_is_a_relaunch(session, in_place, workers, target):
    low = running(session, "low", workers, in_place=in_place)
    low.target = target
    assert not session.in_place(low)
    assert session.moves.calls == []


def test_a_job_asked_to_stop_already_is_not_moved_in_place(session):
    """Its checkpoint stop stands: every rank may have read it."""
    low = running(session, "low", ["w0"])
    low.target, low.stop_at = ["w0", "w1"], 10
    assert not session.in_place(low)
    assert session.moves.calls == []


def test_no_worker_leaves_while_every_worker_kept_is_still_joining(session):
    """`low` runs on w0 and was just grown onto w1 (not yet in a generation); a new target
    w1, w2 would leave it no member to admit w1: nothing is asked until w1 is in, then w0
    leaves and w2 joins."""
    low = running(session, "low", ["w0", "w1"])
    session.moves.joining = {"w1"}
    low.target = ["w1", "w2"]
    assert session.in_place(low)
    assert session.moves.calls == [] and low.target == ["w1", "w2"] and low.stop_at is None
    session.moves.joining = set()  # w1 is in
    session.shrink_waiting()
    assert session.moves.calls == [
        ("shrink", "low", ["w0"]),
        ("grow", "low", ["w2"], ["hetflow-workers-speed-1"]),
    ]
    assert low.workers == ["w1", "w2"] and low.target is None


def test_a_job_moved_wholly_takes_its_new_worker_then_lets_its_own_go(session):
    """`low` on w0, bound for w1 alone, free to move across: w1 is grown onto first and w0
    kept while w1 joins (the job never without a member); once w1 is in, w0 leaves. No stop
    asked."""
    low = running(session, "low", ["w0"])
    low.target, low.across = ["w1"], True
    assert session.in_place(low)
    assert session.moves.calls == [("grow", "low", ["w1"], ["hetflow-workers-speed-1"])]
    assert low.workers == ["w0", "w1"] and low.target == ["w1"]
    session.moves.joining = {"w1"}
    session.shrink_waiting()
    assert len(session.moves.calls) == 1  # w1 still joining: w0 stays
    session.moves.joining = set()
    session.shrink_waiting()
    assert session.moves.calls[1] == ("shrink", "low", ["w0"])
    assert low.workers == ["w1"] and low.target is None and low.stop_at is None


def scripted(session: Session, monkeypatch, got: dict[str, list[str]]) -> None:
    """The allocator's answer fixed (which workers it picks is outside the claim)."""
    monkeypatch.setattr(session, "allocate", lambda act, holding: dict(got))


def test_the_decision_moves_a_chain_across_in_place_and_relaunches_a_cycle(session, monkeypatch):
    """`a` on w0 bound for w1, which `b` holds, bound for the free w2: both in place, `b`
    first (its worker free), `a` once w1 is. `c` on w0 and `d` on w1 bound for each other's
    worker: neither could take its new worker first, both relaunch at their checkpoints."""
    a, b = running(session, "a", ["w0"]), running(session, "b", ["w1"])
    scripted(session, monkeypatch, {"a": ["w1"], "b": ["w2"]})
    session.decide()
    assert a.across and b.across and a.stop_at is None and b.stop_at is None
    assert session.moves.calls == [("grow", "b", ["w2"], ["hetflow-workers-speed-1"])]
    session.jobs.clear()
    session.moves = Recorder()
    c, d = running(session, "c", ["w0"]), running(session, "d", ["w1"])
    scripted(session, monkeypatch, {"c": ["w1"], "d": ["w0"]})
    session.decide()
    assert not (c.across or d.across) and c.stop_at == d.stop_at == 10
    assert session.moves.calls == []


def test_a_decision_while_a_job_stops_places_it_afresh_and_keeps_the_waiting_one_bound(
    tmp_path, monkeypatch
):
    """`low` (not elastic) runs on both workers and was asked to stop at its checkpoint so
    that `high` (waiting) gets w1. A decision meanwhile (the pace setting a unit) weighs
    `low` as the waiting job it is about to be, its stop standing: `high` stays bound for
    w1, `low` for w0; the workers `low` runs on now are not held for it (they were: `low`
    was bound for both again, relaunched on them, and `high` waited for that segment)."""
    from hetflow.queue.jobs import Job, Line

    two = new_session(tmp_path, monkeypatch, [1, 2], switch_s=0.0)
    lines = {k: Line(0.01, 0.001 / (1 + i)) for i, k in enumerate(two.kinds)}
    low = running(two, "low", ["w0", "w1"], in_place=False)
    low.model = Job("low", "low", 64, 100, 0.1, dict(lines), 0.0, 10)
    low.target, low.stop_at = ["w0"], 10
    high = Live(QueueJob(name="high", priority="high", steps=40), None, 0.0, target=["w1"])
    high.model = Job("high", "high", 64, 40, 0.1, dict(lines), 0.0, 10)
    two.jobs.append(high)
    two.decide()
    assert high.target == ["w1"] and low.target == ["w0"]
    assert low.stop_at == 10 and low.workers == ["w0", "w1"]
