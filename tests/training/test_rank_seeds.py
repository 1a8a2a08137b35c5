"""Each rank draws its own dropout masks from the same initial weights: `seed_rank` (pure), and
`build_net` on two real gloo ranks seeding each by its rank once the model is built."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hetflow.config import ClusterSpec, TrainConfig
from hetflow.records import Plan
from hetflow.training.recipes import DataInfo, get_recipe, rank_seed, seed_rank, seeded_model

from tests.dist import run_ranks

TOKENS = DataInfo(kind="tokens", vocab=256)
DROPPING_GPT = {"n_layer": 1, "n_head": 2, "n_embd": 32, "context": 16, "dropout": 0.5}


def _rank_model(seed: int, rank: int):
    """A rank's gpt with dropout as `build_net` leaves it: built at the run's seed, then its
    generators seeded for the rank; (weights, logits of one forward pass in train mode)."""
    model = seeded_model(get_recipe("gpt", **DROPPING_GPT), TOKENS, seed)
    seed_rank(seed, rank)
    x = torch.arange(32).reshape(2, 16) % 256
    return model.state_dict(), model.train()(x).detach()


def test_ranks_of_one_seed_start_equal_and_drop_different_units():
    w0, out0 = _rank_model(seed=3, rank=0)
    w1, out1 = _rank_model(seed=3, rank=1)
    assert w0.keys() == w1.keys() and all(torch.equal(w0[k], w1[k]) for k in w0)
    assert not torch.allclose(out0, out1)  # the same weights and input: the masks differ


def test_a_rank_draws_the_same_masks_in_every_run_of_its_seed():
    _, first = _rank_model(seed=3, rank=1)
    _, again = _rank_model(seed=3, rank=1)
    assert torch.equal(first, again)
    _, other_seed = _rank_model(seed=4, rank=1)
    assert not torch.allclose(first, other_seed)


def test_rank_seeds_differ_between_ranks_and_seeds_and_take_any_int():
    seeds = {rank_seed(s, r) for s in (-1, 0, 1, 2**40) for r in range(4)}
    assert len(seeds) == 16
    assert rank_seed(0, 0) != 0  # rank 0 does not restart the stream its weights came from


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
