"""Top-k's momentum and checkpoint, on one gloo rank: at ratio 1 it keeps SGD's momentum, and a
run resumed from a checkpoint compresses as if it had never stopped."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from hetflow.records import CompressionMethod
from hetflow.training.comm import (
    comm_state_dict,
    load_comm_state,
    register_compression,
    wrap_optimizer,
)

from tests.helpers.training.comm_methods import tiny_model


def _one_rank_run(
    method: str, steps: int, resume_from: dict | None = None, save_at: int | None = None
):
    """SGD, momentum 0.9, under DDP on one gloo rank; (parameters, checkpoint taken at save_at)."""
    parsed = CompressionMethod.parse(method)
    model = tiny_model()
    ddp = DDP(model, gradient_as_bucket_view=True)  # bucket views, as the worker
    state = register_compression(ddp, parsed, warmup_steps=2)
    opt = wrap_optimizer(torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9), parsed, state)
    start, saved = 0, None
    if resume_from is not None:
        model.load_state_dict(resume_from["model"])
        opt.load_state_dict(resume_from["optimizer"])
        load_comm_state(state, resume_from["comm"])
        start = resume_from["step"]
    gen = torch.Generator().manual_seed(7)
    batches = [
        (torch.randn(16, 64, generator=gen), torch.randint(0, 10, (16,), generator=gen))
        for _ in range(steps)
    ]
    for step in range(start, steps):
        x, y = batches[step]
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step + 1 == save_at:
            saved = copy.deepcopy(
                {
                    "step": step + 1,
                    "model": model.state_dict(),
                    "optimizer": opt.state_dict(),
                    "comm": comm_state_dict(state),
                }
            )
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
