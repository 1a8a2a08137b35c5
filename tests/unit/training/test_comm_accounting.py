"""Wire-byte accounting and the emulated link; the collectives counted on real gloo ranks."""

from __future__ import annotations

import pytest

from hetflow.emulation.link import Link
from hetflow.training.comm import allgather_bytes, ring_allreduce_bytes


def test_wire_formulas():
    assert ring_allreduce_bytes(1000, 4) == 1500
    assert ring_allreduce_bytes(1000, 1) == 0
    assert allgather_bytes(1000, 4) == 3000


def test_link_costs_bytes_over_bandwidth_plus_latency():
    assert Link(None, 0.0).delay(1e9, 3) == 0.0
    assert Link(100.0, 0.001).delay(1_000_000, 2) == pytest.approx(0.002 + 8e6 / 100e9)


def test_a_delivered_collective_completes_after_the_link_carried_it_and_transfers_queue():
    """`Link.deliver`: the future completes with the collective's value once the collective
    has completed and the link has then carried the transfer; the caller is not held up, and a
    second transfer waits for the first (one link, one transfer at a time)."""
    import torch

    from hetflow.emulation.link import now

    link = Link(None, 0.5)  # 0.5 s per collective, no bandwidth term
    collective = torch.futures.Future()
    first = link.deliver(collective, 0, 1)
    assert not first.done()  # the collective itself has not completed
    done_at = now()
    collective.set_result([torch.ones(3)])
    assert not first.done()  # completed, but the link has not carried it yet: no one waited
    already = torch.futures.Future()
    already.set_result([torch.zeros(2)])
    second = link.deliver(already, 0, 1)  # issued now, queued behind the first
    torch.testing.assert_close(second.wait()[0], torch.zeros(2))
    assert first.done() and now() >= done_at + 1.0  # 2 x 0.5 s, one after the other
    torch.testing.assert_close(first.value()[0], torch.ones(3))
    failed = torch.futures.Future()
    out = link.deliver(failed, 0, 1)
    failed.set_exception(RuntimeError("gloo: connection reset"))
    with pytest.raises(RuntimeError, match="connection reset"):
        out.wait()


LATENCY_S = 0.02


def ddp_on_a_link(rank: int, world: int, arg: dict) -> dict:
    """Two DDP steps of a model in several buckets, with or without an emulated link on the
    `WireCounter`: the gradients, the collectives counted and the time the link was busy."""
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    from hetflow.emulation.link import now
    from hetflow.training.comm import WireCounter

    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(64, 64) for _ in range(4)))
    ddp = DDP(model, bucket_cap_mb=0.02)  # 16 KB buckets: one or two layers each
    ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    counter = WireCounter(world, link=Link(None, LATENCY_S) if arg["link"] else None)
    counter.install()
    try:
        start = now()
        for step in range(2):
            x = torch.randn(8, 64, generator=torch.Generator().manual_seed(10 * step + rank))
            ddp(x).square().sum().backward()
        busy = (counter.link.free_at - start) if counter.link else 0.0
        grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).tolist()
        return {"grads": grads, "collectives": counter.collectives, "busy": busy}
    finally:
        counter.uninstall()


@pytest.mark.timeout(120)
def test_ddp_buckets_are_carried_by_the_link_one_after_another_and_gradients_are_unchanged(
    tmp_path,
):
    from tests.dist import run_ranks

    plain = run_ranks(ddp_on_a_link, 2, {"link": False}, tmp_path / "plain", timeout_s=100)
    linked = run_ranks(ddp_on_a_link, 2, {"link": True}, tmp_path / "link", timeout_s=100)
    for a, b in zip(plain, linked, strict=True):
        assert a["grads"] == pytest.approx(b["grads"], abs=1e-6)
    for rank in linked:
        assert rank["collectives"] > 2  # more than one bucket in a step, each a collective
        assert rank["busy"] >= rank["collectives"] * LATENCY_S  # queued, none skipped


SHARDED_2_13 = ["all_gather_single", "reduce_scatter_single"]


def test_the_sharded_collectives_are_2_13s_names_where_present_else_the_older_ones():
    from types import SimpleNamespace

    from hetflow.training.comm.accounting import sharded_names

    assert sharded_names(SimpleNamespace(**dict.fromkeys(SHARDED_2_13))) == tuple(SHARDED_2_13)
    older = ("all_gather_into_tensor", "reduce_scatter_tensor")
    assert sharded_names(SimpleNamespace(**dict.fromkeys(older))) == older
    assert sharded_names(SimpleNamespace(all_gather_single=None, **dict.fromkeys(older))) == older


def sharded_collectives_counted(rank: int, world: int, arg: dict) -> dict:
    """With the names in `arg["remove"]` taken out of `torch.distributed` (a torch before
    2.13), a `WireCounter` installed: one all-gather and one reduce-scatter through the names
    FSDP2 would call, then `all_gather_into_tensor` once; what they returned, what was counted,
    and whether `uninstall` put back exactly what was there."""
    import torch
    import torch.distributed as dist

    from hetflow.training.comm import WireCounter
    from hetflow.training.comm.accounting import sharded_names

    with pytest.MonkeyPatch.context() as mp:
        for name in arg["remove"]:
            mp.delattr(dist, name)
        before = {n: getattr(dist, n) for n in dir(dist) if callable(getattr(dist, n))}
        gather, scatter = sharded_names()
        counter = WireCounter(world)
        counter.install()
        try:
            gathered = torch.empty(3 * world)
            getattr(dist, gather)(gathered, torch.full((3,), float(rank + 1)))
            mine = torch.empty(4)
            work = getattr(dist, scatter)(mine, torch.arange(4.0 * world) + rank, async_op=True)
            work.wait()
            sharded = counter.take()
            also = torch.empty(world)
            dist.all_gather_into_tensor(also, torch.tensor([float(rank)]))
            plain = counter.take()
        finally:
            counter.uninstall()
        after = {n: getattr(dist, n) for n in dir(dist) if callable(getattr(dist, n))}
        restored = before.keys() == after.keys() and all(after[n] is before[n] for n in before)
    return {
        "names": [gather, scatter],
        "gathered": gathered.tolist(),
        "scattered": mine.tolist(),
        "also": also.tolist(),
        "sharded": list(sharded),
        "plain": list(plain),
        "restored": restored,
    }


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "remove, names",
    [
        ([], SHARDED_2_13),
        (SHARDED_2_13, ["all_gather_into_tensor", "reduce_scatter_tensor"]),
    ],
    ids=["torch-2.13-names", "older-names"],
)
def test_sharded_collectives_are_counted_once_each_under_the_names_this_torch_has(
    remove, names, tmp_path
):
    """FSDP2's all-gather and reduce-scatter, on 2 gloo ranks: by the 2.13 names where torch
    has them, by `all_gather_into_tensor` / `reduce_scatter_tensor` where it does not (torch
    2.11, 2.12); either way each collective is done and counted once, as a ring's bytes."""
    from tests.dist import run_ranks

    world = 2
    ranks = run_ranks(sharded_collectives_counted, world, {"remove": remove}, tmp_path, 100)
    shard, full = 3 * 4, 4 * world * 4  # bytes: 3 floats gathered, 4 x world scattered
    for rank, got in enumerate(ranks):
        assert got["names"] == names
        assert got["gathered"] == [1.0] * 3 + [2.0] * 3
        mine = [float(2 * (4 * rank + i) + 1) for i in range(4)]  # (x + 0) + (x + 1)
        assert got["scattered"] == mine
        assert got["also"] == [0.0, 1.0]
        assert got["sharded"] == [allgather_bytes(shard, world) + full * (world - 1) / world, 2]
        assert got["plain"] == [allgather_bytes(4, world), 1]  # once, not also inside
        assert got["restored"]
