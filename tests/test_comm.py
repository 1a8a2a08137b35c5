"""Communication methods: byte accounting with real gloo ranks, the top-k hook, bad input, 'auto'.

The multi-process test starts 4 gloo ranks on loopback (this file run as a script, one process
per rank) that train a tiny MLP a few steps under every method and report what `WireCounter`
charged per step; the test compares that with the bytes each algorithm must send.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from hetflow.config import ConfigError, TrainConfig, validated
from hetflow.emulation.link import Link
from hetflow.training.comm import (
    allgather_bytes,
    choose_compression,
    decode_topk_into,
    encode_topk,
    method_warmup_steps,
    parse_method,
    register_compression,
    ring_allreduce_bytes,
    select_topk,
    topk_count,
    topk_density,
    topk_warmup_steps,
    wrap_optimizer,
)

WORLD = 4
WARMUP = 2
STEPS = 6
NODES = ["a", "a", "b", "b"]
METHODS = ["none", "fp16", "bf16", "powersgd:2", "topk:0.01", "topk:1", "localsgd:2", "hierarchical:2"]
MULTI = ["none", "powersgd:2", "topk:0.01"]  # again with small DDP buckets (several per step)
BUCKET_MB = 0.001  # about 1 KB: the tiny MLP then has 2 buckets from step 1 on
SHAPES = [(128, 64), (128,), (10, 128), (10,)]  # the tiny MLP's parameters
ALL_BUT_NAMED = "topk:0.99999"  # a ratio below 1 that still keeps all 9,610 entries


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


# ---------------------------------------------------------------------------------------------
# one rank (this file run as a script)


def _rank_main(argv: list[str]) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from hetflow.training.comm import (
        WireCounter,
        finish_optimizer,
        register_compression,
        wrap_optimizer,
    )

    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int)
    p.add_argument("--init")
    p.add_argument("--out")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{args.init}", rank=args.rank, world_size=WORLD)
    counter = WireCounter(WORLD)
    counter.install()
    out: dict = {}
    try:
        # (label, method, DDP bucket cap, top-k density stage steps, SGD momentum)
        runs = [(m, m, None, 0, 0.0) for m in METHODS] + [(f"{m}@multi", m, BUCKET_MB, 0, 0.0) for m in MULTI]
        runs += [("topk:0.01@staged", "topk:0.01", None, 1, 0.0)]
        runs += [(f"{m}@momentum", m, None, 0, 0.9) for m in ("none", ALL_BUT_NAMED)]
        for label, method, bucket_mb, stage_steps, momentum in runs:
            model = tiny_model()
            ddp = DDP(model) if bucket_mb is None else DDP(model, bucket_cap_mb=bucket_mb)
            buckets: set[int] = set()

            def seen(hook, buckets=buckets):  # like the worker's wrapper; notes the buckets
                def wrapped(state, bucket):
                    buckets.add(bucket.index())
                    return hook(state, bucket)

                return wrapped

            state = register_compression(ddp, method, seen, nodes=NODES, warmup_steps=WARMUP,
                                         density_stage_steps=stage_steps)
            opt = wrap_optimizer(torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=momentum), method, state)
            gen = torch.Generator().manual_seed(100 + args.rank)
            counter.take()
            intra0 = counter.intra_node_bytes
            per_step, spread = [], []
            for _ in range(STEPS):
                x, y = torch.randn(16, 64, generator=gen), torch.randint(0, 10, (16,), generator=gen)
                torch.nn.functional.cross_entropy(ddp(x), y).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                per_step.append(counter.take()[0])
                flat = torch.cat([q.detach().reshape(-1) for q in model.parameters()])
                everyone = [torch.zeros_like(flat) for _ in range(WORLD)]
                dist.all_gather(everyone, flat)
                counter.take()  # the check above is not training traffic
                spread.append(max(float((e - everyone[0]).abs().max()) for e in everyone))
            finish_optimizer(opt, model)
            counter.take()
            out[label] = {
                "buckets": len(buckets),
                "bytes": per_step,
                "intra_bytes": counter.intra_node_bytes - intra0,
                "replica_spread": spread,
                "params": torch.cat([q.detach().reshape(-1) for q in model.parameters()]).tolist(),
            }
            dist.barrier()
    finally:
        counter.uninstall()
        dist.destroy_process_group()
    Path(args.out).write_text(json.dumps(out))


if __name__ == "__main__":
    _rank_main(sys.argv[1:])
    sys.exit(0)


# ---------------------------------------------------------------------------------------------
# the multi-process measurement


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("ranks")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--rank", str(r), "--init", str(tmp / "store"), "--out", str(tmp / f"{r}.json")],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        for r in range(WORLD)
    ]
    deadline = time.monotonic() + 90
    logs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            logs.append(out.decode(errors="replace"))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r} exited {p.returncode}:\n{logs[r][-3000:]}"
    return [json.loads((tmp / f"{r}.json").read_text()) for r in range(WORLD)]


GRAD_BYTES = 4 * sum(math.prod(s) for s in SHAPES)
NONE_BYTES = ring_allreduce_bytes(GRAD_BYTES, WORLD)  # 2(n-1)/n x gradient bytes


def _steady(ranks: list[dict], method: str) -> list[float]:
    return ranks[0][method]["bytes"][WARMUP:]


@pytest.mark.slow
def test_every_rank_counts_the_same_bytes(measured):
    for method in METHODS:
        assert all(r[method]["bytes"] == measured[0][method]["bytes"] for r in measured), method


@pytest.mark.slow
def test_none_counts_ring_allreduce_of_the_gradient(measured):
    assert NONE_BYTES == 1.5 * GRAD_BYTES
    assert measured[0]["none"]["bytes"] == [NONE_BYTES] * STEPS


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fp16", "bf16"])
def test_half_precision_sends_exactly_half(measured, method):
    assert measured[0][method]["bytes"] == [NONE_BYTES / 2] * STEPS


@pytest.mark.slow
def test_powersgd_sends_its_low_rank_factors(measured):
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
    expected = ring_allreduce_bytes(4 * uncompressed, WORLD) + ring_allreduce_bytes(4 * compressed, WORLD)
    bytes_ = measured[0]["powersgd:2"]["bytes"]
    assert bytes_[:WARMUP] == [NONE_BYTES] * WARMUP  # warm-up: plain all-reduce
    assert bytes_[WARMUP:] == [expected] * (STEPS - WARMUP)
    assert NONE_BYTES / expected > 8


@pytest.mark.slow
def test_several_buckets_per_step(measured):
    """Hooks that issue collectives from callbacks (PowerSGD) must keep one order on all ranks."""
    assert measured[0]["none"]["buckets"] == 1
    for m in MULTI:
        assert measured[0][f"{m}@multi"]["buckets"] > 1
        assert all(r[f"{m}@multi"]["bytes"] == measured[0][f"{m}@multi"]["bytes"] for r in measured)
        assert max(measured[0][f"{m}@multi"]["replica_spread"]) < 1e-5, m
    assert measured[0]["none@multi"]["bytes"] == [NONE_BYTES] * STEPS
    # PowerSGD's bytes do not depend on how tensors are bucketed
    assert measured[0]["powersgd:2@multi"]["bytes"] == measured[0]["powersgd:2"]["bytes"]
    # top-k keeps ceil(ratio x n) per bucket: a little more than in one bucket, never less
    one, multi = _steady(measured, "topk:0.01")[0], _steady(measured, "topk:0.01@multi")[0]
    per_entry = allgather_bytes(8, WORLD)
    assert one <= multi < one + per_entry * measured[0]["topk:0.01@multi"]["buckets"]


@pytest.mark.slow
def test_topk_sends_values_and_indices(measured):
    k = topk_count(GRAD_BYTES // 4, 0.01)  # the tiny model is one DDP bucket
    expected = allgather_bytes(k * (4 + 4), WORLD)  # fp32 value + int32 index per entry
    assert _steady(measured, "topk:0.01") == [expected] * (STEPS - WARMUP)
    assert NONE_BYTES / expected >= 20


@pytest.mark.slow
def test_topk_warms_up_through_density_stages(measured):
    # one step per stage: 25%, 6.25%, 1.5625%, then the method's 1%
    ks = [topk_count(GRAD_BYTES // 4, topk_density(0.01, s, 1)) for s in range(STEPS - WARMUP)]
    assert ks == [topk_count(GRAD_BYTES // 4, d) for d in (0.25, 0.0625, 0.015625, 0.01)]
    assert _steady(measured, "topk:0.01@staged") == [allgather_bytes(k * 8, WORLD) for k in ks]
    assert topk_warmup_steps(0.01, WARMUP, 1) == WARMUP + 3
    assert topk_warmup_steps(0.3, WARMUP, 1) == WARMUP  # above the first stage: no stages


@pytest.mark.slow
@pytest.mark.parametrize("label,method,stage_steps", [
    *[(m, m, 0) for m in ("none", "fp16", "bf16", "powersgd:2", "topk:0.01")],
    ("topk:0.01@staged", "topk:0.01", 1),
])
def test_method_warmup_steps_is_where_the_bytes_settle(measured, label, method, stage_steps):
    # what bench comm times and counts from: every step after it sends what the last one does
    sent = measured[0][label]["bytes"]
    w = method_warmup_steps(method, WARMUP, stage_steps)
    assert sent[w:] == [sent[-1]] * (STEPS - w)
    assert w == 0 or sent[w - 1] != sent[-1]


@pytest.mark.slow
def test_topk_sending_everything_with_momentum_is_momentum_sgd(measured):
    # below 1 the hook takes SGD's momentum over (momentum correction); sending everything, it must
    # step as momentum SGD does, which clearing the momentum where it sent would break
    a = torch.tensor(measured[0]["none@momentum"]["params"])
    b = torch.tensor(measured[0][f"{ALL_BUT_NAMED}@momentum"]["params"])
    assert topk_count(GRAD_BYTES // 4, 0.99999) == GRAD_BYTES // 4
    assert torch.allclose(a, b, atol=1e-5)
    assert not torch.allclose(a, torch.tensor(measured[0]["none"]["params"]), atol=1e-3)


@pytest.mark.slow
def test_topk_at_ratio_one_is_plain_averaging(measured):
    a = torch.tensor(measured[0]["none"]["params"])
    b = torch.tensor(measured[0]["topk:1"]["params"])
    assert torch.allclose(a, b, atol=1e-5)
    assert max(measured[0]["topk:1"]["replica_spread"]) < 1e-5


@pytest.mark.slow
def test_compressed_runs_keep_replicas_in_sync(measured):
    for method in ("fp16", "bf16", "powersgd:2", "topk:0.01"):
        assert max(measured[0][method]["replica_spread"]) < 1e-5, method


@pytest.mark.slow
def test_localsgd_averages_the_model_every_h_steps(measured):
    bytes_ = measured[0]["localsgd:2"]["bytes"]
    spread = measured[0]["localsgd:2"]["replica_spread"]
    params = ring_allreduce_bytes(GRAD_BYTES, WORLD)  # parameters are as large as the gradient
    # warm-up: gradient all-reduce; then the model is averaged after steps 2 and 4 only
    assert bytes_ == [NONE_BYTES, NONE_BYTES, params, 0.0, params, 0.0]
    assert spread[2] < 1e-6 and spread[4] < 1e-6  # averaged
    assert spread[3] > 1e-4 and spread[5] > 1e-4  # replicas drift between averagings
    finals = [torch.tensor(r["localsgd:2"]["params"]) for r in measured]  # after finish_optimizer
    assert all(torch.allclose(f, finals[0], atol=1e-6) for f in finals)


@pytest.mark.slow
def test_hierarchical_keeps_intra_node_traffic_off_the_link(measured):
    bytes_ = measured[0]["hierarchical:2"]["bytes"]
    params = ring_allreduce_bytes(GRAD_BYTES, WORLD)
    assert bytes_ == [NONE_BYTES, NONE_BYTES, params, 0.0, params, 0.0]
    # steps 2..5: gradients all-reduced inside each 2-rank node, off the link
    assert measured[0]["hierarchical:2"]["intra_bytes"] == 4 * ring_allreduce_bytes(GRAD_BYTES, 2)
    spread = measured[0]["hierarchical:2"]["replica_spread"]
    assert spread[3] > 1e-4  # the two nodes drift apart between averagings


# ---------------------------------------------------------------------------------------------
# the top-k compressor (pure)


@pytest.mark.parametrize("n, ratio", [(1000, 0.01), (300_000, 0.01), (300_000, 0.001), (300_000, 0.3), (5, 1.0)])
def test_select_topk_is_exact(n, ratio):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    k = topk_count(n, ratio)
    got = select_topk(x.abs(), k, torch.Generator().manual_seed(1))
    assert got.numel() == k and got.unique().numel() == k
    assert set(got.tolist()) == set(x.abs().topk(k).indices.tolist())


def test_topk_count_bounds():
    assert topk_count(1000, 0.01) == 10
    assert topk_count(10, 0.001) == 1
    assert topk_count(10, 1.0) == 10


def test_error_feedback_loses_nothing():
    """What was sent plus what is still held back equals everything that came in."""
    gen = torch.Generator().manual_seed(0)
    n, k = 5000, 50
    residual = torch.zeros(n)
    sent = torch.zeros(n)
    total = torch.zeros(n)
    for _ in range(20):
        g = torch.randn(n, generator=gen)
        total += g
        residual = g + residual
        payload, idx = encode_topk(residual, k)  # zeroes the sent entries of `residual`
        assert payload.numel() == k * 8 and idx.numel() == k
        sent += decode_topk_into(torch.empty(n), [payload], k)
    assert torch.allclose(sent + residual, total, atol=1e-4)


def test_decode_sums_the_contributions_of_all_ranks():
    k = 2
    a, _ = encode_topk(torch.tensor([0.0, 5.0, -7.0, 1.0]), k)
    b, _ = encode_topk(torch.tensor([3.0, 0.0, -9.0, 0.0]), k)
    assert decode_topk_into(torch.empty(4), [a, b], k).tolist() == [3.0, 5.0, -16.0, 0.0]


# ---------------------------------------------------------------------------------------------
# accounting and link (pure)


def test_wire_formulas():
    assert ring_allreduce_bytes(1000, 4) == 1500
    assert ring_allreduce_bytes(1000, 1) == 0
    assert allgather_bytes(1000, 4) == 3000


def test_link_costs_bytes_over_bandwidth_plus_latency():
    assert Link(None, 0.0).delay(1e9, 3) == 0.0
    assert Link(100.0, 0.001).delay(1_000_000, 2) == pytest.approx(0.002 + 8e6 / 100e9)


# ---------------------------------------------------------------------------------------------
# bad input names the field


@pytest.mark.parametrize(
    "value, expected",
    [
        ("gzip", "unknown method"),
        ("POWERSGD:4", "unknown method"),
        ("powersgd", "powersgd needs powersgd:RANK"),
        ("powersgd:0", "powersgd rank must be a whole number >= 1"),
        ("powersgd:-1", "powersgd rank must be a whole number >= 1"),
        ("fp16:2", "fp16 takes no argument"),
        ("topk:0", "topk ratio must be a number in (0, 1]"),
        ("topk:1.5", "topk ratio must be a number in (0, 1]"),
        ("topk:-0.1", "topk ratio must be a number in (0, 1]"),
        ("topk:1e-400", "topk ratio must be a number in (0, 1]"),
        ("topk:nan", "topk ratio must be a number in (0, 1]"),
        ("topk:.", "topk ratio must be a number"),
        ("localsgd:0", "localsgd period must be a whole number >= 1"),
        ("localsgd:-3", "localsgd period must be a whole number >= 1"),
    ],
)
def test_train_config_refuses_bad_methods_naming_the_field(value, expected):
    with pytest.raises(ConfigError) as e:
        validated(TrainConfig, {"compression": value}, "train")
    msg = str(e.value)
    assert msg.startswith("train.compression:") and expected in msg and "\n" not in msg


@pytest.mark.parametrize("value", ["none", "auto", "fp16", "bf16", "powersgd:1", "topk:1", "topk:0.001", "localsgd:1"])
def test_train_config_accepts_good_methods(value):
    assert TrainConfig(compression=value).compression == value


@pytest.mark.parametrize(
    "value, expected",
    [("hierarchical:0", "hierarchical period must be a whole number >= 1"), ("zip:3", "unknown method"), ("topk:2", "topk ratio")],
)
def test_parse_method_names_the_field(value, expected):
    with pytest.raises(ValueError) as e:
        parse_method(value)
    assert str(e.value).startswith("train.compression:") and expected in str(e.value)


def test_parse_method_knows_hierarchical():
    assert parse_method("hierarchical:4") == ("hierarchical", 4)
    assert parse_method("topk:0.01") == ("topk", 0.01)


# ---------------------------------------------------------------------------------------------
# 'auto'


def test_auto_keeps_none_when_communication_is_cheap(caplog):
    caplog.set_level("INFO", logger="hetflow.training.comm")
    method, reason = choose_compression(0.05)
    assert method == "none" and "5%" in reason
    assert "none" in caplog.text and "5%" in caplog.text  # the reason is logged


def test_auto_compresses_when_communication_dominates():
    method, reason = choose_compression(0.7)
    assert method.startswith("powersgd") and "70%" in reason
    assert method == "powersgd:4" and choose_compression(0.4)[0] == method  # from the threshold on


@pytest.mark.parametrize("share", [0.0, 0.2, 0.39, 0.41, 0.6, 0.99, 1.0])
def test_auto_is_monotone_in_the_share(share):
    order = ["none", "powersgd:4"]
    lower = choose_compression(max(0.0, share - 0.05))[0]
    assert order.index(lower) <= order.index(choose_compression(share)[0])


def _one_rank_run(method: str, steps: int, resume_from: dict | None = None, save_at: int | None = None):
    """SGD with momentum 0.9 under DDP on one gloo rank; (parameters, checkpoint taken at save_at)."""
    from hetflow.training.comm import comm_state_dict, load_comm_state

    model = tiny_model()
    ddp = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)  # as the worker
    state = register_compression(ddp, method, warmup_steps=2)
    opt = wrap_optimizer(torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9), method, state)
    start, saved = 0, None
    if resume_from is not None:
        model.load_state_dict(resume_from["model"])
        opt.load_state_dict(resume_from["optimizer"])
        load_comm_state(state, resume_from["comm"])
        start = resume_from["step"]
    gen = torch.Generator().manual_seed(7)
    batches = [(torch.randn(16, 64, generator=gen), torch.randint(0, 10, (16,), generator=gen)) for _ in range(steps)]
    for step in range(start, steps):
        x, y = batches[step]
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step + 1 == save_at:
            saved = copy.deepcopy({"step": step + 1, "model": model.state_dict(), "optimizer": opt.state_dict(),
                                   "comm": comm_state_dict(state)})
    return [p.detach().clone() for p in model.parameters()], saved


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_topk_at_ratio_one_keeps_sgd_momentum(one_rank):
    plain, _ = _one_rank_run("none", 8)
    topk, _ = _one_rank_run("topk:1", 8)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(plain, topk, strict=True))


@pytest.mark.parametrize("save_at", [1, 5])
def test_a_topk_run_resumed_from_a_checkpoint_compresses_as_if_never_stopped(one_rank, save_at):
    # the momentum handed to the hook, the error-feedback residuals and the warm-up counter live
    # in the hook's state, laid out in DDP's buckets, which a new DDP instance re-orders after
    # its first step: lost or mixed up on resume, the resumed run would drift from the whole one
    whole, saved = _one_rank_run("topk:0.05", 10, save_at=save_at)
    resumed, _ = _one_rank_run("topk:0.05", 10, resume_from=saved)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(whole, resumed, strict=True))
