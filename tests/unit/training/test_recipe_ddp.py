"""The all-reduced gradient is the gradient of the MEAN over the global batch's counts, for a
token-weighted loss whose counts differ between ranks and between steps (4 real gloo ranks,
`MeanOverCounts` as the training loop uses it): padded windows (counts all-reduced every
step) and full windows (`count_per_sample`, no collective), r + 1 windows on rank r."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hetflow.training.recipes import DataInfo, seeded_model
from hetflow.training.recipes.gpt import GPT

from tests.dist import run_ranks

WORLD = 4
STEPS = 2  # the first step waits for the count; the second backpropagates with the first's
OPTIONS = {"n_layer": 1, "n_head": 2, "n_embd": 16, "context": 8}
TOKENS = DataInfo(kind="tokens", vocab=256)


class PaddedGPT(GPT):
    """gpt on windows whose last targets may be padding: its count varies per sample."""

    count_per_sample = None

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self.count_per_sample = None


def recipe_of(padded: bool) -> GPT:
    return PaddedGPT(**OPTIONS) if padded else GPT(**OPTIONS)


def windows(rank: int, step: int, padded: bool) -> np.ndarray:
    """Rank r's windows at a step: r + 1 of them; padded: the last few targets padding (-1),
    so that the ranks count different numbers of tokens, and differently at every step."""
    rng = np.random.default_rng(100 * step + rank)
    w = rng.integers(0, 256, size=(rank + 1, OPTIONS["context"] + 1), dtype=np.int64)
    pad = (rank + 3 * step) % 6 if padded else 0
    if pad:
        w[:, -pad:] = -1
    return w


def _flat_grad(model: torch.nn.Module) -> list[float]:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).tolist()


def ddp_gradients(rank: int, world: int, arg: dict) -> dict:
    """One rank: DDP over the gpt recipe, each step's loss weighted by `MeanOverCounts`."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from hetflow.training.comm import new_control_group
    from hetflow.training.loop.weighting import MeanOverCounts

    padded = arg["padded"]
    recipe = recipe_of(padded)
    model = seeded_model(recipe, TOKENS, 0)
    ddp = DDP(model, gradient_as_bucket_view=True)
    per_sample = recipe.count_per_sample
    mean = MeanOverCounts(world, per_sample, None if per_sample else new_control_group())
    global_batch = sum(r + 1 for r in range(world))
    grads, counts = [], []
    for step in range(STEPS):
        w = windows(rank, step, padded)
        loss_sum, count = recipe.loss(ddp, recipe.batch(w, np.zeros(len(w), dtype=np.int64)))
        mean.backward(loss_sum, count, len(w), global_batch)
        mean.correct(model)
        counts.append(count)
        grads.append(_flat_grad(model) if rank == 0 else [])
        model.zero_grad(set_to_none=True)
    return {"grads": grads, "counts": counts}


def one_process_gradients(step: int, padded: bool) -> torch.Tensor:
    """The reference: one process, the ranks' windows concatenated, mean over the tokens."""
    recipe = recipe_of(padded)
    model = seeded_model(recipe, TOKENS, 0)
    w = np.concatenate([windows(r, step, padded) for r in range(WORLD)])
    loss_sum, count = recipe.loss(model, recipe.batch(w, np.zeros(len(w), dtype=np.int64)))
    (loss_sum / count).backward()
    return torch.tensor(_flat_grad(model))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("padded", [True, False], ids=["padded", "full-windows"])
def test_ddp_gradient_is_the_mean_over_tokens_with_unequal_counts_per_rank(tmp_path, padded):
    results = run_ranks(ddp_gradients, WORLD, {"padded": padded}, tmp_path, timeout_s=100)
    for step in range(STEPS):
        counts = [r["counts"][step] for r in results]
        assert len(set(counts)) == WORLD, counts  # every rank counts a different number
        ddp = torch.tensor(results[0]["grads"][step])
        torch.testing.assert_close(ddp, one_process_gradients(step, padded), atol=1e-5, rtol=0)
    if padded:
        totals = [sum(r["counts"][step] for r in results) for step in range(STEPS)]
        assert totals[0] != totals[1]  # the second step corrects the first's count


IMAGES = DataInfo(kind="images", classes=10, shape=(3, 8, 8))


def images(rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank r's uint8 images: 2r + 1 of them (1, 3, 5, 7), as a plan's unequal local batches."""
    rng = np.random.default_rng(rank)
    n = 2 * rank + 1
    return rng.integers(0, 256, (n, 3, 8, 8), dtype=np.uint8), rng.integers(0, 10, n)


def resnet_ddp_gradient(rank: int, world: int, arg: dict) -> dict:
    """One rank: DDP over the resnet recipe on its unequal batch, the loss weighted as training
    weights it (`MeanOverCounts`, a fixed count per sample: no collective)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from hetflow.training.loop.weighting import MeanOverCounts
    from hetflow.training.recipes import get_recipe

    recipe = get_recipe("resnet", width=8, blocks=1, norm=arg["norm"])
    model = seeded_model(recipe, IMAGES, 0)
    ddp = DDP(model, gradient_as_bucket_view=True)
    mean = MeanOverCounts(world, recipe.count_per_sample, None)
    x, y = images(rank)
    loss_sum, count = recipe.loss(ddp, recipe.batch(x, y))
    mean.backward(loss_sum, count, len(y), sum(2 * r + 1 for r in range(world)))
    mean.correct(model)
    return {"grad": _flat_grad(model) if rank == 0 else []}


@pytest.mark.timeout(120)
def test_resnet_gradient_over_unequal_batches_is_the_global_batchs(tmp_path):
    """GroupNorm (the default) makes each sample's output its own: 4 ranks with 1, 3, 5 and 7
    images all-reduce the gradient of one process on all 16 to 1e-5. BatchNorm, normalizing per
    local batch, does not (so the test can tell the two apart)."""
    from hetflow.training.recipes import get_recipe

    xs, ys = zip(*(images(r) for r in range(WORLD)), strict=True)
    for norm, exact in (("group", True), ("batch", False)):
        results = run_ranks(
            resnet_ddp_gradient, WORLD, {"norm": norm}, tmp_path / norm, timeout_s=100
        )
        recipe = get_recipe("resnet", width=8, blocks=1, norm=norm)
        model = seeded_model(recipe, IMAGES, 0)
        loss_sum, count = recipe.loss(model, recipe.batch(np.concatenate(xs), np.concatenate(ys)))
        (loss_sum / count).backward()
        close = torch.allclose(
            torch.tensor(results[0]["grad"]), torch.tensor(_flat_grad(model)), atol=1e-5, rtol=0
        )
        assert close == exact, norm
