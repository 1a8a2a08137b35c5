"""Wire-byte accounting and the emulated link (pure)."""

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
