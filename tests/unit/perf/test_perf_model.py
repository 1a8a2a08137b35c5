"""Every caller of the performance model (`hetflow.perf`) agrees with it on one cluster: the
planner, the simulator, the rental search, the queue's allocator and the DiLoCo round sizing
give the step time and the shares the model gives. Pure: no torch, no processes."""

from __future__ import annotations

import pytest

from hetflow.config import ClusterSpec, TrainConfig
from hetflow.forecast.rent.search import Candidate, balanced_compute_s
from hetflow.forecast.simulate.job import Job, Network, WorkerModel
from hetflow.forecast.simulate.models import MODELS
from hetflow.forecast.simulate.step import allreduce_time, simulate_step
from hetflow.perf.balance import balanced_time, fill, step_on
from hetflow.perf.collective import (
    RING_ALPHA_S,
    MeasuredRing,
    all_gather_time,
    ddp_buckets,
    outer_allreduce_time,
    reduce_scatter_time,
    ring_allreduce_time,
)
from hetflow.perf.curve import Line, Table
from hetflow.queue.allocate import step_s
from hetflow.queue.jobs import Job as QueueJob
from hetflow.queue.jobs import Kind, allreduce_s
from hetflow.queue.jobs import Line as QueueLine
from hetflow.records import Profile
from hetflow.training.plan.planner import StepModel, ideal_throughput, make_plan
from hetflow.training.plan.prior import line_rank
from hetflow.training.plan.rounds import inner_batch, inner_counts, round_plan

# One cluster: three devices' compute lines (a + c x b), one link, one gradient, one batch.
LINES = [Line(0.010, 1e-3), Line(0.010, 2e-3), Line(0.020, 4e-3)]
GBPS = 10.0
GRAD_BYTES = 40e6
BATCH = 96
N = len(LINES)


def costs():
    return [line.time for line in LINES]


def model_step() -> float:
    """The model's step on the cluster: the balanced compute plus the ring all-reduce."""
    return balanced_time(LINES, BATCH) + ring_allreduce_time(GRAD_BYTES, N, RING_ALPHA_S, GBPS)


def profile() -> Profile:
    ranks = [line_rank(i, ln.a, ln.c, 32, worker=f"w{i}") for i, ln in enumerate(LINES)]
    whole = ring_allreduce_time(GRAD_BYTES, N, RING_ALPHA_S, GBPS)
    latency = ring_allreduce_time(0.0, N, RING_ALPHA_S, GBPS)
    for r in ranks:
        r.grad_allreduce_s, r.allreduce_latency_s = whole, latency
    return Profile(cluster="c", model="digits", ranks=ranks)


def test_the_all_reduce_is_a_reduce_scatter_then_an_all_gather():
    args = (GRAD_BYTES, N, RING_ALPHA_S, GBPS)
    assert ring_allreduce_time(*args) == reduce_scatter_time(*args) + all_gather_time(*args)
    assert outer_allreduce_time(*args, every=4) == ring_allreduce_time(*args) / 4
    assert ring_allreduce_time(GRAD_BYTES, 1, RING_ALPHA_S, GBPS) == 0.0


def test_a_measured_all_reduce_carried_to_its_own_size_is_itself_and_to_others_the_ring():
    measured = ring_allreduce_time(GRAD_BYTES, 8, RING_ALPHA_S, GBPS)
    ring = MeasuredRing(measured, 8, ring_allreduce_time(0.0, 8, RING_ALPHA_S, GBPS))
    assert ring.time(8) == pytest.approx(measured)
    for n in (2, 3, 5):
        assert ring.time(n) == pytest.approx(ring_allreduce_time(GRAD_BYTES, n, RING_ALPHA_S, GBPS))


def test_the_planner_predicts_the_models_step_and_balances_as_it_does():
    prof = profile()
    latency, per_sample = prof.step_models()
    whole, fixed = prof.ranks[0].grad_allreduce_s, prof.ranks[0].allreduce_latency_s
    model = StepModel(latency, per_sample, [None] * N, BATCH, whole, fixed)
    assert model.step(list(range(N))) == pytest.approx(model_step(), rel=1e-12)
    assert ideal_throughput(latency, per_sample, BATCH) == BATCH / balanced_time(LINES, BATCH)
    plan = make_plan(prof, ClusterSpec.from_speeds([1] * N), TrainConfig(global_batch=BATCH))
    kept = [i for i, b in enumerate(plan.local_batches) if b]
    assert kept == [0, 1]  # the slowest buys less than its hops of the ring: the model says so
    ring = [LINES[i] for i in kept]
    alone = balanced_time(ring, BATCH) + ring_allreduce_time(GRAD_BYTES, 2, RING_ALPHA_S, GBPS)
    assert model.step(kept) == pytest.approx(alone, rel=1e-12) and alone < model_step()
    best = fill([ln.time for ln in ring], BATCH, [BATCH] * len(ring))
    assert [plan.local_batches[i] for i in kept] == best


def test_the_simulator_predicts_the_models_all_reduce_and_shares():
    workers = [
        WorkerModel(f"w{i}", ln.a, ln.c, link_gbps=GBPS, device="CPU") for i, ln in enumerate(LINES)
    ]
    net = Network()
    grad = MODELS["resnet50"].grad_bytes
    buckets = ddp_buckets(grad)
    assert allreduce_time(workers, grad, net) == ring_allreduce_time(
        grad, N, net.alpha_s, GBPS, buckets
    )
    job = Job(MODELS["resnet50"], global_batch=BATCH)
    step = simulate_step(workers, job, net, plan="optimized")
    best = fill(costs(), BATCH, [BATCH] * N)
    assert step.compute_s == pytest.approx(step_on(costs(), best))
    assert step.step_time_s == pytest.approx(step.compute_s + step.comm_s)


def test_the_rental_search_balances_the_models_curves():
    tables = [Table(tuple(ln.time(b) for b in range(1, BATCH + 1))) for ln in LINES]
    cands = [
        Candidate(f"t{i}", 1, 1.0, 1, "CPU", None, GBPS, t.steps) for i, t in enumerate(tables)
    ]
    levels = sorted({s for t in tables for s in t.steps})
    searched = balanced_compute_s(cands, [1] * N, BATCH, levels)
    assert searched == balanced_time(tables, BATCH, [BATCH] * N, levels=levels)
    assert searched == pytest.approx(step_on(costs(), fill(costs(), BATCH, [BATCH] * N)))
    assert searched >= balanced_time(LINES, BATCH)  # whole samples: never under the continuous


def test_the_queue_allocator_predicts_the_models_step():
    kinds = [Kind(f"k{i}", 80, GBPS) for i in range(N)]
    lines = {k.name: QueueLine(ln.a, ln.c) for k, ln in zip(kinds, LINES, strict=True)}
    job = QueueJob("j", "normal", BATCH, 10, 1, lines, grad_mb=GRAD_BYTES / 1e6)
    assert step_s(job, kinds) == pytest.approx(model_step(), rel=1e-12)


def test_the_queue_all_reduce_pays_the_rings_latency():
    """The queue's all-reduce once left out the hops' latency; it is the model's ring now."""
    kinds = [Kind(f"k{i}", 80, GBPS) for i in range(N)]
    job = QueueJob("j", "normal", BATCH, 10, 1, {}, grad_mb=GRAD_BYTES / 1e6)
    bandwidth_only = 2 * (N - 1) / N * GRAD_BYTES * 8 / (GBPS * 1e9)
    assert allreduce_s(job, kinds) == ring_allreduce_time(GRAD_BYTES, N, RING_ALPHA_S, GBPS)
    assert allreduce_s(job, kinds) == pytest.approx(bandwidth_only + 2 * (N - 1) * RING_ALPHA_S)
    assert allreduce_s(job, kinds[:1]) == 0.0


def test_the_round_sizing_gives_inner_steps_by_the_models_lines():
    prof = profile()
    train = TrainConfig(strategy="diloco", global_batch=BATCH, steps=20)
    cluster = ClusterSpec.from_speeds([1] * N)
    plan = round_plan(prof, cluster, train)
    b = inner_batch(train, N)
    rates = [b / ln.time(b) for ln in LINES]
    counts = [share // b for share in plan.local_batches]
    assert counts == inner_counts(rates, sum(counts))
    round_s = [k * ln.time(b) for k, ln in zip(counts, LINES, strict=True)]
    assert max(round_s) - min(round_s) <= max(ln.time(b) for ln in LINES)
