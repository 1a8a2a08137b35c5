"""The strategies as plug-ins (`training.loop.strategies`): a registry of builders that the
loop asks by `train.strategy`, each entry building a rank's model and optimizer and its loop
step on real ranks."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from hetflow.config import ClusterSpec, TrainConfig
from hetflow.records import Plan
from hetflow.training.loop.strategies import STRATEGIES

from tests.dist import run_ranks


def one_step(rank: int, world: int, arg: dict) -> dict:
    """One rank: the strategy of `arg`'s job built by its registered builders, as the loop
    builds it (`TrainingLoop.build_strategy`), and one loop step on the rank's share of the
    first batch; the loss, its count, the bytes counted and whether the weights moved."""
    import torch

    from hetflow.infra.data.reader import open_rank_data
    from hetflow.training.comm import WireCounter
    from hetflow.training.devices import MixedPrecision, to_device
    from hetflow.training.launch.ready import launch_ready
    from hetflow.training.launch.spec import RunSpec, emulator_for
    from hetflow.training.loop.strategies import StepParts, strategy_of
    from hetflow.training.loop.weighting import MeanOverCounts
    from hetflow.training.recipes import recipe_of

    spec = launch_ready(RunSpec.model_validate(arg))  # as `run_workers` hands it to the ranks
    counter = WireCounter(world)
    counter.install()
    data = open_rank_data(spec.dataset)
    try:
        strategy, recipe = strategy_of(spec.train.strategy), recipe_of(spec.train)
        emu = emulator_for(spec, rank)
        net = strategy.build_net(spec, data, emu, recipe, "cpu", rank=rank)
        amp = MixedPrecision("cpu", "fp32", scaled=False)
        mean = MeanOverCounts(world, recipe.count_per_sample, None)
        parts = StepParts(spec, rank, emu, mean, amp, counter, recipe)
        stepper = strategy.build_stepper(net, parts)
        before = {k: v.clone() for k, v in net.weights().items()}
        plan = list(spec.plan.local_batches)
        xs, ys = data.reader(rank, spec.train.seed).batch(0, plan)
        loss, count, nbytes = stepper.step(to_device(recipe.batch(xs, ys), "cpu"), len(ys), plan)
        emu.finish()
        after = net.weights()  # every rank calls it: under fsdp a gather onto rank 0
        moved = any(not torch.equal(v, after[k]) for k, v in before.items())
        return {"loss": float(loss), "count": count, "bytes": nbytes, "moved": moved}
    finally:
        data.close()
        counter.uninstall()


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_each_registered_strategy_builds_and_steps_on_two_real_ranks(name, local_digits, tmp_path):
    from hetflow.training.launch.spec import RunSpec

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    spec = RunSpec(
        run_name=name,
        variant=name,
        cluster=ClusterSpec.from_speeds([1.0, 1.0], emulate=False),
        dataset=local_digits,
        train=TrainConfig(recipe="digits-mlp", global_batch=16, steps=2, strategy=name),
        plan=Plan.equal([8, 8]),
        run_dir=str(run_dir),
    )
    ranks = run_ranks(one_step, 2, spec.model_dump(mode="json"), Path(run_dir) / "ranks")
    assert [r["count"] for r in ranks] == [8, 8]
    assert all(math.isfinite(r["loss"]) and r["bytes"] > 0 for r in ranks)
    assert ranks[0]["moved"]  # rank 0 holds the full weights under every strategy
