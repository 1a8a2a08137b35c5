"""Each rank draws its own dropout masks from the same initial weights: `seed_rank` (pure), and
`build_net` on two real gloo ranks seeding each by its rank once the model is built."""

from __future__ import annotations

import torch

from hetflow.training.recipes import DataInfo, get_recipe, rank_seed, seed_rank, seeded_model

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
