"""Each rank draws its own dropout masks from the same initial weights: `seed_rank` (pure), and
`build_net` on two real gloo ranks seeding each by its rank once the model is built."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hetflow.config import ClusterSpec, TrainConfig
from hetflow.records import Plan
from hetflow.training.recipes import seed_rank

from tests.dist import run_ranks

# -- build_net on real ranks ------------------------------------------------------------------


def net_draws(rank: int, world: int, arg: dict) -> dict:
    """One rank: `build_net` on the job `arg` (a RunSpec's JSON); the weights it built and what
    torch draws next (as a dropout mask would be)."""
    from hetflow.infra.data.reader import open_rank_data
    from hetflow.training.launch.ready import launch_ready
    from hetflow.training.launch.spec import RunSpec, emulator_for
    from hetflow.training.loop.net import build_net
    from hetflow.training.recipes import recipe_of

    spec = launch_ready(RunSpec.model_validate(arg))  # as `run_workers` hands it to the ranks
    data = open_rank_data(spec.dataset)
    try:
        net = build_net(spec, data, emulator_for(spec, rank), recipe_of(spec.train), rank=rank)
        weights = torch.cat([p.detach().reshape(-1) for p in net.model.parameters()])
        return {"weights": weights.tolist(), "draws": torch.rand(8).tolist()}
    finally:
        data.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_build_net_gives_ranks_the_same_weights_and_their_own_generators(local_digits, tmp_path):
    from hetflow.training.launch.spec import RunSpec

    seed = 5
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    spec = RunSpec(
        run_name="seeds",
        variant="seeds",
        cluster=ClusterSpec.from_speeds([1.0, 1.0], emulate=False),
        dataset=local_digits,
        train=TrainConfig(recipe="digits-mlp", global_batch=16, steps=1, seed=seed),
        plan=Plan.equal([8, 8]),
        run_dir=str(run_dir),
    )
    ranks = run_ranks(net_draws, 2, spec.model_dump(mode="json"), Path(run_dir) / "ranks")
    assert ranks[0]["weights"] == ranks[1]["weights"]
    expected = []
    for rank in range(2):
        seed_rank(seed, rank)
        expected.append(torch.rand(8).tolist())
    assert [r["draws"] for r in ranks] == expected
    assert expected[0] != expected[1]
