"""Micro-batches per worker (`train.accumulate: auto`): the plan's sizes and counts under the
memory caps, the bad input refused, and on real gloo ranks the accumulated gradient equal to
one process's on the global batch whatever each rank's count."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hetflow.training.comm import ring_allreduce_bytes
from hetflow.training.launch.run import run_workers

from tests.dist import run_ranks
from tests.helpers.training.micro_batches import AUTO_KW, _NoAmp
from tests.integration.training.test_training import (
    _assert_same_params,
    _one_step_spec,
    _single_process_steps,
)
from tests.unit.training.test_recipe_ddp import TOKENS, _flat_grad, recipe_of, windows

# -- on real gloo ranks -----------------------------------------------------------------------

WORLD = 4


CAPS = [None, 1, 2, 4]  # rank r runs r + 1 windows: 1, 2, 2 and 1 micro-batches


STEPS = 2  # the first step backpropagates with the global batch as N, then corrects


def micro_gradients(rank: int, world: int, arg: dict) -> dict:
    """One rank: the `Stepper`'s micro-batches under DDP (no emulation), the gradient after
    each step's accumulation and `MeanOverCounts.correct`, and the bytes its all-reduces sent."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from hetflow.training.comm import new_control_group
    from hetflow.training.loop.micro import split_batch
    from hetflow.training.loop.rank_step import Stepper
    from hetflow.training.loop.weighting import MeanOverCounts

    recipe = recipe_of(arg["padded"])
    model = seeded_model_on(recipe)
    ddp = DDP(model, gradient_as_bucket_view=True)
    per_sample = recipe.count_per_sample
    group = None if per_sample else new_control_group()
    mean = MeanOverCounts(world, per_sample, group, accumulate=True)
    emu = SimpleNamespace(start=lambda key=None: None, finish=lambda: 0.0)
    net = SimpleNamespace(ddp=ddp, model=model, no_sync=ddp.no_sync)
    stepper = Stepper(net, emu, mean, _NoAmp(), None, recipe, CAPS[rank])
    plan = [r + 1 for r in range(world)]
    grads, counts, parts = [], [], []
    for step in range(STEPS):
        w = windows(rank, step, arg["padded"])
        batch = recipe.batch(w, np.zeros(len(w), dtype=np.int64))
        pieces = split_batch(batch, len(w), CAPS[rank])
        _, count = stepper.accumulate(pieces, plan)
        mean.correct(model)
        counts.append(count)
        parts.append(len(pieces))
        grads.append(_flat_grad(model) if rank == 0 else [])
        model.zero_grad(set_to_none=True)
    return {"grads": grads, "counts": counts, "parts": parts}


def seeded_model_on(recipe):
    from hetflow.training.recipes import seeded_model

    return seeded_model(recipe, TOKENS, 0)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("padded", [True, False], ids=["padded", "full-windows"])
def test_accumulated_micro_batches_give_the_global_batchs_mean_gradient(tmp_path, padded):
    from tests.unit.training.test_recipe_ddp import one_process_gradients

    results = run_ranks(micro_gradients, WORLD, {"padded": padded}, tmp_path, timeout_s=100)
    assert [r["parts"][0] for r in results] == [1, 2, 2, 1]  # counts differ: no hang
    for step in range(STEPS):
        ddp = torch.tensor(results[0]["grads"][step])
        torch.testing.assert_close(ddp, one_process_gradients(step, padded), atol=1e-5, rtol=0)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_share_past_its_cap_trains_as_micro_batches_like_one_process(digits, tmp_path):
    """torchrun, 4 ranks of shares 3, 5, 9, 15; w1 holds 2 samples and w3 4 at once: 3 and 4
    micro-batches. After 3 SGD steps with momentum every rank's model is one process's on the
    global batch, and each rank sent one all-reduce's bytes per step."""
    spec = _one_step_spec(digits, tmp_path, [3, 5, 9, 15], "micro")
    spec.cluster.workers[1].memory_cap_batch = 2
    spec.cluster.workers[3].memory_cap_batch = 4
    train = spec.train.model_copy(update={"steps": 3, "momentum": 0.9, **AUTO_KW})
    spec = spec.model_copy(update={"train": train})
    result, _ = run_workers(spec, timeout_s=200)
    ranks = result["ranks"]
    assert [r["records"][0]["micro_batches"] for r in ranks] == [1, 3, 1, 4]
    grad = 4 * ranks[0]["params"]
    for r in ranks:
        assert [rec["bytes_sent"] for rec in r["records"]] == [ring_allreduce_bytes(grad, 4)] * 3
    plans = [{"step": 0, "plan": spec.plan.local_batches}]
    reference = _single_process_steps(spec, plans, 3)
    _assert_same_params(torch.load(Path(spec.run_dir) / "model.pt"), reference[-1][0])
