"""The communication methods on real gloo ranks: the bytes each sends, replicas kept in sync,
warm-ups, local SGD's averaging, hierarchical traffic kept off the link.

Each method trains a tiny MLP a few steps on 4 ranks (`tests.dist`), in a launch of its own
(a module fixture per method, so that one method's failure fails its own tests only), and
reports what `WireCounter` charged per step; the tests compare that with the bytes each
algorithm must send.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from hetflow.records import CompressionMethod
from hetflow.training.comm import (
    WireCounter,
    allgather_bytes,
    finish_optimizer,
    local_averager,
    method_warmup_steps,
    register_compression,
    ring_allreduce_bytes,
    topk_count,
    topk_density,
    wrap_optimizer,
)

from tests.dist import run_ranks
from tests.helpers.training.comm_methods import tiny_model

WORLD = 4


WARMUP = 2


STEPS = 6


NODES = ["a", "a", "b", "b"]


BUCKET_MB = 0.001  # about 1 KB: the tiny MLP then has 2 buckets from step 1 on


SHAPES = [(128, 64), (128,), (10, 128), (10,)]  # the tiny MLP's parameters


ALL_BUT_NAMED = "topk:0.99999"  # a ratio below 1 that still keeps all 9,610 entries


GRAD_BYTES = 4 * sum(math.prod(s) for s in SHAPES)


NONE_BYTES = ring_allreduce_bytes(GRAD_BYTES, WORLD)  # 2(n-1)/n x gradient bytes


# every rank's local batch at each step: averaged after steps 2 and 4, where the batches at
# the step, the samples since the last average and equal weights all differ; rank 1 left out
UNEQUAL = [[4, 4, 4, 4], [4, 4, 4, 4], [2, 0, 6, 8], [8, 0, 4, 4], [4, 0, 12, 0], [4, 4, 4, 4]]


# ---------------------------------------------------------------------------------------------
# one rank (run by tests.dist.run_ranks)


def _seen(hook, buckets: set[int]):
    """Like the worker's hook wrapper; notes the buckets."""

    def wrapped(state, bucket):
        buckets.add(bucket.index())
        return hook(state, bucket)

    return wrapped


def _train_one(
    counter, rank: int, method: str, bucket_mb, stage_steps: int, momentum: float, batches=None
):
    """`batches[step]`: every rank's local batch at that step (default 16 each), noted with the
    averager of local SGD and hierarchical averaging; each rank's loss is the mean over its own
    batch (0 without samples)."""
    parsed = CompressionMethod.parse(method)
    model = tiny_model()
    ddp = DDP(model) if bucket_mb is None else DDP(model, bucket_cap_mb=bucket_mb)
    buckets: set[int] = set()
    state = register_compression(
        ddp,
        parsed,
        lambda hook: _seen(hook, buckets),
        nodes=NODES,
        warmup_steps=WARMUP,
        density_stage_steps=stage_steps,
    )
    sgd = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=momentum)
    opt = wrap_optimizer(sgd, parsed, state)
    gen = torch.Generator().manual_seed(100 + rank)
    counter.take()
    intra0 = counter.intra_node_bytes
    averager = local_averager(opt)
    per_step, spread, before, after = [], [], [], []
    for step in range(STEPS):
        plan = batches[step] if batches else [16] * WORLD
        n = plan[rank]
        x, y = torch.randn(n, 64, generator=gen), torch.randint(0, 10, (n,), generator=gen)
        loss = torch.nn.functional.cross_entropy(ddp(x), y, reduction="sum") / max(n, 1)
        loss.backward()
        if averager is None:
            opt.step()
        else:  # PostLocalSGDOptimizer.step, with the replica before its averaging kept
            averager.trained(n, sum(plan))
            opt.optim.step()
            before.append(_flat(model))
            averager.average_parameters(opt.param_groups)
        opt.zero_grad(set_to_none=True)
        per_step.append(counter.take()[0])
        flat = _flat(model)
        after.append(flat)
        everyone = [torch.zeros_like(flat) for _ in range(WORLD)]
        dist.all_gather(everyone, flat)
        counter.take()  # the check above is not training traffic
        spread.append(max(float((e - everyone[0]).abs().max()) for e in everyone))
    finish_optimizer(opt, model)
    counter.take()
    out = {
        "buckets": len(buckets),
        "bytes": per_step,
        "intra_bytes": counter.intra_node_bytes - intra0,
        "replica_spread": spread,
        "params": _flat(model).tolist(),
    }
    if batches:  # every step's replica before and after the averager
        out["before"] = [t.tolist() for t in before]
        out["after"] = [t.tolist() for t in after]
    return out


def _flat(model) -> torch.Tensor:
    return torch.cat([q.detach().reshape(-1) for q in model.parameters()]).clone()


def train_runs(rank: int, world: int, runs: list) -> dict:
    """Each run [label, method, DDP bucket cap MB, top-k density stage steps, SGD momentum,
    per-step local batches] trained in turn under a `WireCounter`; {label: what it measured}."""
    counter = WireCounter(world)
    counter.install()
    out: dict = {}
    try:
        for label, method, bucket_mb, stage_steps, momentum, batches in runs:
            out[label] = _train_one(
                counter, rank, method, bucket_mb, stage_steps, momentum, batches
            )
            dist.barrier()
    finally:
        counter.uninstall()
    return out


# ---------------------------------------------------------------------------------------------
# one launch per method


def _run(
    method: str,
    label: str | None = None,
    *,
    bucket_mb=None,
    stage_steps=0,
    momentum=0.0,
    batches=None,
):
    return [label or method, method, bucket_mb, stage_steps, momentum, batches]


def _launch(tmp_path_factory, name: str, runs: list) -> list[dict]:
    work = tmp_path_factory.mktemp(name)
    return run_ranks(train_runs, WORLD, runs, work, timeout_s=120)


@pytest.fixture(scope="module")
def none_ranks(tmp_path_factory):
    return _launch(
        tmp_path_factory,
        "none",
        [
            _run("none"),
            _run("none", "none@multi", bucket_mb=BUCKET_MB),  # small buckets: several per step
            _run("none", "none@momentum", momentum=0.9),
        ],
    )


@pytest.fixture(scope="module")
def fp16_ranks(tmp_path_factory):
    return _launch(tmp_path_factory, "fp16", [_run("fp16")])


@pytest.fixture(scope="module")
def bf16_ranks(tmp_path_factory):
    return _launch(tmp_path_factory, "bf16", [_run("bf16")])


@pytest.fixture(scope="module")
def powersgd_ranks(tmp_path_factory):
    return _launch(
        tmp_path_factory,
        "powersgd",
        [
            _run("powersgd:2"),
            _run("powersgd:2", "powersgd:2@multi", bucket_mb=BUCKET_MB),
        ],
    )


@pytest.fixture(scope="module")
def topk_ranks(tmp_path_factory):
    return _launch(
        tmp_path_factory,
        "topk",
        [
            _run("topk:0.01"),
            _run("topk:0.01", "topk:0.01@multi", bucket_mb=BUCKET_MB),
            _run("topk:0.01", "topk:0.01@staged", stage_steps=1),
            _run("topk:1"),
            _run(ALL_BUT_NAMED, f"{ALL_BUT_NAMED}@momentum", momentum=0.9),
        ],
    )


@pytest.fixture(scope="module")
def localsgd_ranks(tmp_path_factory):
    return _launch(
        tmp_path_factory,
        "localsgd",
        [_run("localsgd:2"), _run("localsgd:2", "localsgd:2@unequal", batches=UNEQUAL)],
    )


@pytest.fixture(scope="module")
def hierarchical_ranks(tmp_path_factory):
    return _launch(tmp_path_factory, "hierarchical", [_run("hierarchical:2")])


FIXTURE = {
    "none": "none_ranks",
    "fp16": "fp16_ranks",
    "bf16": "bf16_ranks",
    "powersgd:2": "powersgd_ranks",
    "topk:0.01": "topk_ranks",
    "topk:1": "topk_ranks",
    "localsgd:2": "localsgd_ranks",
    "hierarchical:2": "hierarchical_ranks",
}


def _ranks(request, method: str) -> list[dict]:
    """Every rank's measurements of the launch that ran `method`."""
    return request.getfixturevalue(FIXTURE[method.split("@")[0]])


def _steady(ranks: list[dict], label: str) -> list[float]:
    return ranks[0][label]["bytes"][WARMUP:]


# ---------------------------------------------------------------------------------------------
# bytes on the wire


@pytest.mark.slow
@pytest.mark.parametrize("method", list(FIXTURE))
def test_every_rank_counts_the_same_bytes(request, method):
    measured = _ranks(request, method)
    assert all(r[method]["bytes"] == measured[0][method]["bytes"] for r in measured), method


@pytest.mark.slow
def test_none_counts_ring_allreduce_of_the_gradient(none_ranks):
    assert NONE_BYTES == 1.5 * GRAD_BYTES
    assert none_ranks[0]["none"]["bytes"] == [NONE_BYTES] * STEPS


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fp16", "bf16"])
def test_half_precision_sends_exactly_half(request, method):
    assert _ranks(request, method)[0][method]["bytes"] == [NONE_BYTES / 2] * STEPS


@pytest.mark.slow
def test_powersgd_sends_its_low_rank_factors(powersgd_ranks):
    r = 2
    uncompressed = compressed = 0
    for shape in SHAPES:
        if len(shape) == 1:
            uncompressed += shape[0]
            continue
        n, m = shape[0], math.prod(shape[1:])
        if (n + m) * r < n * m:
            compressed += (n + m) * r  # P (n x r) and Q (m x r)
        else:
            uncompressed += n * m
    expected = ring_allreduce_bytes(4 * uncompressed, WORLD) + ring_allreduce_bytes(
        4 * compressed, WORLD
    )
    bytes_ = powersgd_ranks[0]["powersgd:2"]["bytes"]
    assert bytes_[:WARMUP] == [NONE_BYTES] * WARMUP  # warm-up: plain all-reduce
    assert bytes_[WARMUP:] == [expected] * (STEPS - WARMUP)
    assert NONE_BYTES / expected > 8


@pytest.mark.slow
def test_topk_sends_values_and_indices(topk_ranks):
    k = topk_count(GRAD_BYTES // 4, 0.01)  # the tiny model is one DDP bucket
    expected = allgather_bytes(k * (4 + 4), WORLD)  # fp32 value + int32 index per entry
    assert _steady(topk_ranks, "topk:0.01") == [expected] * (STEPS - WARMUP)
    assert NONE_BYTES / expected >= 20


@pytest.mark.slow
def test_topk_warms_up_through_density_stages(topk_ranks):
    # one step per stage: 25%, 6.25%, 1.5625%, then the method's 1%
    # (tests/unit/training/test_topk.py)
    ks = [topk_count(GRAD_BYTES // 4, topk_density(0.01, s, 1)) for s in range(STEPS - WARMUP)]
    expected = [allgather_bytes(k * 8, WORLD) for k in ks]
    assert _steady(topk_ranks, "topk:0.01@staged") == expected


# ---------------------------------------------------------------------------------------------
# several DDP buckets per step


@pytest.mark.slow
@pytest.mark.parametrize("method", ["none", "powersgd:2", "topk:0.01"])
def test_several_buckets_per_step(request, method):
    """Hooks that issue collectives from callbacks (PowerSGD) must keep one order on all ranks."""
    measured, multi = _ranks(request, method), f"{method}@multi"
    assert measured[0][multi]["buckets"] > 1
    assert all(r[multi]["bytes"] == measured[0][multi]["bytes"] for r in measured)
    assert max(measured[0][multi]["replica_spread"]) < 1e-5, method


@pytest.mark.slow
def test_none_sends_the_same_bytes_in_one_bucket_or_several(none_ranks):
    assert none_ranks[0]["none"]["buckets"] == 1
    assert none_ranks[0]["none@multi"]["bytes"] == [NONE_BYTES] * STEPS


@pytest.mark.slow
def test_powersgd_bytes_do_not_depend_on_bucketing(powersgd_ranks):
    assert (
        powersgd_ranks[0]["powersgd:2@multi"]["bytes"] == powersgd_ranks[0]["powersgd:2"]["bytes"]
    )


@pytest.mark.slow
def test_topk_keeps_its_ratio_per_bucket(topk_ranks):
    # top-k keeps ceil(ratio x n) per bucket: a little more than in one bucket, never less
    one, multi = _steady(topk_ranks, "topk:0.01")[0], _steady(topk_ranks, "topk:0.01@multi")[0]
    per_entry = allgather_bytes(8, WORLD)
    assert one <= multi < one + per_entry * topk_ranks[0]["topk:0.01@multi"]["buckets"]


# ---------------------------------------------------------------------------------------------
# warm-ups, replicas, models


@pytest.mark.slow
@pytest.mark.parametrize(
    "label,method,stage_steps",
    [
        *[(m, m, 0) for m in ("none", "fp16", "bf16", "powersgd:2", "topk:0.01")],
        ("topk:0.01@staged", "topk:0.01", 1),
    ],
)
def test_method_warmup_steps_is_where_the_bytes_settle(request, label, method, stage_steps):
    # what bench comm times and counts from: every step after it sends what the last one does
    sent = _ranks(request, method)[0][label]["bytes"]
    w = method_warmup_steps(CompressionMethod.parse(method), WARMUP, stage_steps)
    assert sent[w:] == [sent[-1]] * (STEPS - w)
    assert w == 0 or sent[w - 1] != sent[-1]


@pytest.mark.slow
def test_topk_sending_everything_with_momentum_is_momentum_sgd(none_ranks, topk_ranks):
    # below 1 the hook takes SGD's momentum over (momentum correction); sending everything, it
    # must step as momentum SGD does, which clearing the momentum where it sent would break
    a = torch.tensor(none_ranks[0]["none@momentum"]["params"])
    b = torch.tensor(topk_ranks[0][f"{ALL_BUT_NAMED}@momentum"]["params"])
    assert topk_count(GRAD_BYTES // 4, 0.99999) == GRAD_BYTES // 4
    assert torch.allclose(a, b, atol=1e-5)
    assert not torch.allclose(a, torch.tensor(none_ranks[0]["none"]["params"]), atol=1e-3)


@pytest.mark.slow
def test_topk_at_ratio_one_is_plain_averaging(none_ranks, topk_ranks):
    a = torch.tensor(none_ranks[0]["none"]["params"])
    b = torch.tensor(topk_ranks[0]["topk:1"]["params"])
    assert torch.allclose(a, b, atol=1e-5)
    assert max(topk_ranks[0]["topk:1"]["replica_spread"]) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fp16", "bf16", "powersgd:2", "topk:0.01"])
def test_compressed_runs_keep_replicas_in_sync(request, method):
    assert max(_ranks(request, method)[0][method]["replica_spread"]) < 1e-5, method


@pytest.mark.slow
def test_localsgd_averages_the_model_every_h_steps(localsgd_ranks):
    bytes_ = localsgd_ranks[0]["localsgd:2"]["bytes"]
    spread = localsgd_ranks[0]["localsgd:2"]["replica_spread"]
    params = ring_allreduce_bytes(GRAD_BYTES, WORLD)  # parameters are as large as the gradient
    # warm-up: gradient all-reduce; then the model is averaged after steps 2 and 4 only
    assert bytes_ == [NONE_BYTES, NONE_BYTES, params, 0.0, params, 0.0]
    assert spread[2] < 1e-6 and spread[4] < 1e-6  # averaged
    assert spread[3] > 1e-4 and spread[5] > 1e-4  # replicas drift between averagings
    # after finish_optimizer
    finals = [torch.tensor(r["localsgd:2"]["params"]) for r in localsgd_ranks]
    assert all(torch.allclose(f, finals[0], atol=1e-6) for f in finals)


def _sample_weights(batches: list[list[int]], steps: range) -> list[float]:
    """Each rank's samples over `steps`, over every rank's."""
    own = [sum(batches[t][r] for t in steps) for r in range(WORLD)]
    return [s / sum(own) for s in own]


@pytest.mark.slow
def test_localsgd_weights_each_replica_by_its_samples_since_the_last_average(localsgd_ranks):
    run = [r["localsgd:2@unequal"] for r in localsgd_ranks]
    assert run[0]["bytes"] == localsgd_ranks[0]["localsgd:2"]["bytes"]  # no collective added
    before = [torch.tensor(r["before"]) for r in run]  # [rank][step]: replica before averaging
    for step, since in [(2, range(2, 3)), (4, range(3, 5))]:
        weights = _sample_weights(UNEQUAL, since)
        expected = sum(w * b[step] for w, b in zip(weights, before, strict=True))
        for r in run:
            torch.testing.assert_close(torch.tensor(r["after"][step]), expected)
        equal = sum(b[step] for b in before) / WORLD
        assert (equal - expected).abs().max() > 1e-4  # not equal weights
    # after step 4, nor the batches of the step alone (after step 2 they are the samples since)
    at_step = sum(n / 16 * b[4] for n, b in zip(UNEQUAL[4], before, strict=True))
    assert (at_step - torch.tensor(run[0]["after"][4])).abs().max() > 1e-4
    # rank 1, left out since step 2, weighs nothing: its replica (the warm-up's) is not pulled in
    assert _sample_weights(UNEQUAL, range(3, 5))[1] == 0
    assert not torch.allclose(before[1][4], before[0][4], atol=1e-4)
    # finish_optimizer after step 5 (equal batches): the replicas' plain mean
    finals = [torch.tensor(r["params"]) for r in run]
    torch.testing.assert_close(finals[0], sum(torch.tensor(r["after"][5]) for r in run) / WORLD)
    assert all(torch.equal(f, finals[0]) for f in finals)


@pytest.mark.slow
def test_hierarchical_keeps_intra_node_traffic_off_the_link(hierarchical_ranks):
    run = hierarchical_ranks[0]["hierarchical:2"]
    params = ring_allreduce_bytes(GRAD_BYTES, WORLD)
    assert run["bytes"] == [NONE_BYTES, NONE_BYTES, params, 0.0, params, 0.0]
    # steps 2..5: gradients all-reduced inside each 2-rank node, off the link
    assert run["intra_bytes"] == 4 * ring_allreduce_bytes(GRAD_BYTES, 2)
    assert run["replica_spread"][3] > 1e-4  # the two nodes drift apart between averagings
