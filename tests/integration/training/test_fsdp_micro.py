"""Micro-batches under sharded data parallelism (`train.accumulate: auto` with
`train.strategy: fsdp`): ranks whose shares split into different counts of micro-batches (1, 3,
2, and a rank with no samples) make the same collectives in every step and train the weights
and momentum of one process on the global batch; the planner splits a capped worker's share
under fsdp as under DDP."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hetflow.training.launch.run import run_workers

from tests.dist import run_ranks
from tests.helpers.training.fsdp import assert_same_momentum, dcp_state, fsdp_spec
from tests.integration.training.test_training import (
    _assert_same_params,
    _single_process_steps,
    no_restarts,
)

WORLD = 3


CAPS = [None, 3, 2]


# each step's local batches (17 samples): micro-batch counts 1,3,2 / 1,1,1 (no rank splits) /
# 1 (no samples),3,4 / 1,2,3
PLANS = [[4, 9, 4], [13, 3, 1], [0, 9, 8], [5, 6, 6]]


LR, MOMENTUM = 0.3, 0.9


def setup(kind: str):
    """(recipe, DataInfo) of `kind`: digits-mlp (units only, no parameter at the root), or a
    gpt on padded windows (`PaddedGPT`: its tied embedding at the root, its count varying per
    sample, so all-reduced every step)."""
    from hetflow.training.recipes import DataInfo, get_recipe

    from tests.unit.training.test_recipe_ddp import TOKENS, recipe_of

    return (recipe_of(True), TOKENS) if kind == "gpt" else (get_recipe(kind), DataInfo())


def global_batch(kind: str, step: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Step `step`'s `n` samples, the same in every process: digits-shaped (64 features, 10
    classes), or gpt windows with the last (i + step) % 5 targets of sample i padding."""
    rng = np.random.default_rng(step)
    if kind != "gpt":
        return rng.random((n, 64), dtype=np.float32), rng.integers(0, 10, n)
    from tests.unit.training.test_recipe_ddp import OPTIONS

    w = rng.integers(0, 256, size=(n, OPTIONS["context"] + 1), dtype=np.int64)
    for i in range(n):
        pad = (i + step) % 5
        if pad:
            w[i, -pad:] = -1
    return w, np.zeros(n, dtype=np.int64)


class _Counting:
    """The project's `WireCounter`, installed, with each `take` (one per step) kept."""

    def __init__(self, world: int) -> None:
        from hetflow.training.comm import WireCounter

        self.wire, self.taken = WireCounter(world), []
        self.wire.install()

    def take(self) -> tuple[float, int]:
        self.taken.append(self.wire.take())
        return self.taken[-1]


def sharded_micro_steps(rank: int, world: int, arg: dict) -> dict:
    """One rank: the recipe of `arg`'s kind sharded (`sharded.shard_model`), SGD with
    momentum, `Stepper.step` on each plan of `arg` under the caps; the bytes and collectives
    of each step, and rank 0's gathered weights and momentum at the end."""
    from hetflow.training.comm import new_control_group
    from hetflow.training.devices import MixedPrecision
    from hetflow.training.loop import sharded
    from hetflow.training.loop.fsdp import ShardedNet
    from hetflow.training.loop.rank_step import Stepper
    from hetflow.training.loop.weighting import MeanOverCounts
    from hetflow.training.recipes import seeded_model

    kind = arg["kind"]
    recipe, info = setup(kind)
    model = seeded_model(recipe, info, 0)
    model = sharded.shard_model(model, recipe.shard_units(model))
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    caps = arg["caps"]
    net = ShardedNet(model, model, opt, None, caps=caps)
    counter = _Counting(world)
    emu = SimpleNamespace(start=lambda key=None: None, finish=lambda: 0.0)
    per_sample = recipe.count_per_sample
    group = None if per_sample else new_control_group()
    mean = MeanOverCounts(world, per_sample, group, accumulate=True)
    amp = MixedPrecision("cpu", "fp32", scaled=False)
    stepper = Stepper(net, emu, mean, amp, counter, recipe, caps[rank])
    for step, plan in enumerate(arg["plans"]):
        x, y = global_batch(kind, step, sum(plan))
        lo = sum(plan[:rank])
        share = x[lo : lo + plan[rank]], y[lo : lo + plan[rank]]
        stepper.step(recipe.batch(*share), plan[rank], plan)
    weights, optim = sharded.full_state(model, opt)
    out = {"taken": counter.taken, "units": gathering_units(model)}
    if rank == 0:
        out["weights"] = {k: v.tolist() for k, v in weights.items()}
        out["momentum"] = {k: s["momentum_buffer"].tolist() for k, s in optim["state"].items()}
    return out


def gathering_units(model: torch.nn.Module) -> int:
    """The FSDP modules that hold parameters of their own (not a nested unit's): each makes
    one all-gather per gathering and one reduce-scatter per backward that syncs."""
    from torch.distributed.fsdp import FSDPModule

    fsdp = [m for m in model.modules() if isinstance(m, FSDPModule)]

    def own(m) -> bool:
        nested = {id(p) for n in m.modules() if n is not m and n in fsdp for p in n.parameters()}
        return any(id(p) not in nested for p in m.parameters())

    return sum(map(own, fsdp))


def one_process(kind: str, plans: list[list[int]]) -> tuple[dict, dict]:
    """The reference: one process, SGD with momentum on each step's global batch, the loss
    its mean over the batch's count; (weights, momentum by parameter name)."""
    from hetflow.training.recipes import seeded_model

    recipe, info = setup(kind)
    model = seeded_model(recipe, info, 0)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for step, plan in enumerate(plans):
        opt.zero_grad()
        loss_sum, count = recipe.loss(model, recipe.batch(*global_batch(kind, step, sum(plan))))
        (loss_sum / count).backward()
        opt.step()
    names = [k for k, _ in model.named_parameters()]
    momentum = {k: opt.state[p]["momentum_buffer"] for k, p in zip(names, model.parameters())}
    return model.state_dict(), momentum


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["digits-mlp", "gpt"], ids=["mlp", "padded-gpt"])
def test_ranks_with_different_micro_batch_counts_make_the_same_collectives(tmp_path, kind):
    arg = {"plans": PLANS, "caps": CAPS, "kind": kind}
    results = run_ranks(sharded_micro_steps, WORLD, arg, tmp_path, timeout_s=150)  # no hang
    taken = [r["taken"] for r in results]
    assert all(t == taken[0] for t in taken), taken  # bytes and collectives, step by step
    # a step where a share splits: one all-gather and one reduce-scatter per unit; one where
    # none does: FSDP's default, each unit but the root gathered again for its backward
    counts, units = [c for _, c in taken[0]], results[0]["units"]
    assert counts[0] == counts[2] == counts[3] == 2 * units < counts[1], counts
    weights, momentum = one_process(kind, PLANS)
    got = {k: torch.tensor(v) for k, v in results[0]["weights"].items()}
    _assert_same_params(got, weights)
    for k, v in results[0]["momentum"].items():
        torch.testing.assert_close(torch.tensor(v), momentum[k], atol=1e-5, rtol=0)


def micro_spec(digits, run_dir: Path, plan: list[int], caps: list[int | None], steps: int):
    """`fsdp_spec` (SGD with momentum, a checkpoint every 2 steps) with `train.accumulate`
    'auto' and the workers' declared `caps`."""
    spec = fsdp_spec(digits, run_dir, plan)
    for w, cap in zip(spec.cluster.workers, caps, strict=True):
        w.memory_cap_batch = cap
    train = spec.train.model_copy(update={"accumulate": "auto", "steps": steps})
    return spec.model_copy(update={"train": train})


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_fsdp_micro_batches_train_like_one_process_and_resume_on_fewer_workers(digits, tmp_path):
    """torchrun: 4 ranks of shares 4, 9, 6 and 0 under caps -, 3, 3, -: 1, 3, 2 and 1 (empty)
    micro-batches; the checkpoint after step 2 holds one process's weights and momentum. Two
    workers then go on from it, one of them splitting its share, and after 2 more steps hold
    one process's weights on the whole batch."""
    four = micro_spec(digits, tmp_path / "four", [4, 9, 6, 0], [None, 3, 3, None], 3)
    result, _ = run_workers(no_restarts(four), timeout_s=240)
    ranks = result["ranks"]
    assert [r["records"][0]["micro_batches"] for r in ranks] == [1, 3, 2, 1]
    sent = [[rec["bytes_sent"] for rec in r["records"]] for r in ranks]
    assert sent[0][0] > 0 and all(s == sent[0] for s in sent), sent
    reference = _single_process_steps(four, [{"step": 0, "plan": [4, 9, 6, 0]}], 4)
    _assert_same_params(torch.load(Path(four.run_dir) / "model.pt"), reference[2][0])
    saved_at = Path(four.run_dir) / "checkpoints"
    from hetflow.training.loop.checkpoint_store import CheckpointStore

    folder = saved_at / CheckpointStore(str(saved_at)).load()["shards"]
    whole = dcp_state(folder, tmp_path)
    _assert_same_params(whole["model"], reference[1][0])
    assert_same_momentum(whole["optim"], *reference[1])
    two = micro_spec(digits, tmp_path / "two", [7, 12], [None, 5], 4)
    two = two.model_copy(update={"checkpoint_url": str(saved_at)})
    result, _ = run_workers(no_restarts(two), timeout_s=240)
    assert [r["records"][-1]["micro_batches"] for r in result["ranks"]] == [1, 3]
    _assert_same_params(torch.load(Path(two.run_dir) / "model.pt"), reference[3][0])
