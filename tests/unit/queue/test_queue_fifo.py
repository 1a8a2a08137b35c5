"""FIFO, the queue's baseline (pure): arrival order whatever the class, each job the first
free workers in the cluster's order that hold it, never a worker's speed, no overtaking."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hetflow.queue.fifo import fifo
from hetflow.queue.jobs import Job, Kind, Line

KINDS = {"slow": Kind("slow", 16), "fast": Kind("fast", 80)}
# the slow workers first in the cluster's order: FIFO takes them first all the same
WORKERS = {"s0": "slow", "s1": "slow", "f0": "fast", "f1": "fast"}


def job(name, priority="normal", memory_gb=4.0, speedup=8.0):
    lines = {"slow": Line(0.01, 0.01), "fast": Line(0.01, 0.01 / speedup)}
    return Job(name, priority, 32, 100, memory_gb, lines)


def test_arrival_order_wins_over_priority_and_nothing_is_taken_back():
    low, high = job("low", "low"), job("high", "high")
    got = fifo([low, high], {}, WORKERS, KINDS, {"low": 3, "high": 2})
    assert got == {"low": ["s0", "s1", "f0"]}  # high waits for two free workers
    # low runs on: high is not given low's workers, whatever its class
    assert fifo([low, high], got, WORKERS, KINDS, {"low": 3, "high": 2}) == got
    assert fifo([low, high], {}, WORKERS, KINDS, {"low": 2, "high": 2}) == {
        "low": ["s0", "s1"],
        "high": ["f0", "f1"],
    }


def test_blind_to_speed_the_first_free_workers_in_the_clusters_order():
    """A job that runs 8x faster on `fast` gets the slow workers first, as listed."""
    gpt = job("gpt", speedup=8.0)
    assert fifo([gpt], {}, WORKERS, KINDS, {"gpt": 1}) == {"gpt": ["s0"]}
    assert fifo([gpt], {"x": ["s0"]}, WORKERS, KINDS, {"gpt": 2}) == {
        "x": ["s0"],
        "gpt": ["s1", "f0"],
    }


def test_a_job_that_cannot_start_blocks_every_job_behind_it():
    a, b, c = job("a"), job("b"), job("c")
    got = fifo([a, b, c], {"a": ["s0", "s1", "f0"]}, WORKERS, KINDS, {"b": 2, "c": 1})
    assert got == {"a": ["s0", "s1", "f0"]}  # c would fit on f1, but b came first


def test_no_request_takes_every_worker_that_holds_the_job_and_memory_is_respected():
    big = job("big", memory_gb=40.0)
    assert fifo([big], {}, WORKERS, KINDS) == {"big": ["f0", "f1"]}
    assert fifo([big], {}, WORKERS, KINDS, {"big": 9}) == {"big": ["f0", "f1"]}
    small = job("small")
    assert fifo([small], {}, WORKERS, KINDS, {"small": None}) == {"small": list(WORKERS)}
    # the big job waits for both fast workers, blocking the small one behind it
    assert fifo([big, small], {"x": ["f1"]}, WORKERS, KINDS, {"small": 1}) == {"x": ["f1"]}


@settings(max_examples=60, deadline=None)
@given(
    spec=st.lists(
        st.tuples(st.sampled_from(["high", "normal", "low"]), st.sampled_from([None, 1, 2, 3])),
        min_size=1,
        max_size=6,
    ),
    running=st.integers(0, 2),
)
def test_no_worker_is_given_twice_and_no_job_overtakes_an_earlier_one(spec, running):
    jobs = [job(f"j{i}", p) for i, (p, _) in enumerate(spec)]
    requests = {f"j{i}": r for i, (_, r) in enumerate(spec)}
    holding = {"r": list(WORKERS)[:running]} if running else {}
    got = fifo(jobs, holding, WORKERS, KINDS, requests)
    given_ = [w for names in got.values() for w in names]
    assert len(given_) == len(set(given_))
    started = [j.name in got for j in jobs]
    assert started == sorted(started, reverse=True)  # a prefix of the arrivals starts
    for j in jobs:
        if j.name in got:
            want = requests[j.name] or len(WORKERS)
            assert len(got[j.name]) == min(want, len(WORKERS))
