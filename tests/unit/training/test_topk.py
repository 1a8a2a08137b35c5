"""The top-k compressor (pure): exact selection, counts, error feedback, decoding, density
stages."""

from __future__ import annotations

import pytest
import torch

from hetflow.training.comm import (
    decode_topk_into,
    encode_topk,
    select_topk,
    topk_count,
    topk_density,
    topk_warmup_steps,
)

# the tiny MLP's of tests/{unit,integration}/training/test_comm_methods.py, one DDP bucket
ENTRIES = 9610


@pytest.mark.parametrize(
    "n, ratio", [(1000, 0.01), (300_000, 0.01), (300_000, 0.001), (300_000, 0.3), (5, 1.0)]
)
def test_select_topk_is_exact(n, ratio):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    k = topk_count(n, ratio)
    got = select_topk(x.abs(), k, torch.Generator().manual_seed(1))
    assert got.numel() == k and got.unique().numel() == k
    assert set(got.tolist()) == set(x.abs().topk(k).indices.tolist())


def test_topk_count_bounds():
    assert topk_count(1000, 0.01) == 10
    assert topk_count(10, 0.001) == 1
    assert topk_count(10, 1.0) == 10


def test_error_feedback_loses_nothing():
    """What was sent plus what is still held back equals everything that came in."""
    gen = torch.Generator().manual_seed(0)
    n, k = 5000, 50
    residual = torch.zeros(n)
    sent = torch.zeros(n)
    total = torch.zeros(n)
    for _ in range(20):
        g = torch.randn(n, generator=gen)
        total += g
        residual = g + residual
        payload, idx = encode_topk(residual, k)  # zeroes the sent entries of `residual`
        assert payload.numel() == k * 8 and idx.numel() == k
        sent += decode_topk_into(torch.empty(n), [payload], k)
    assert torch.allclose(sent + residual, total, atol=1e-4)


def test_decode_sums_the_contributions_of_all_ranks():
    k = 2
    a, _ = encode_topk(torch.tensor([0.0, 5.0, -7.0, 1.0]), k)
    b, _ = encode_topk(torch.tensor([3.0, 0.0, -9.0, 0.0]), k)
    assert decode_topk_into(torch.empty(4), [a, b], k).tolist() == [3.0, 5.0, -16.0, 0.0]


def test_topk_warms_up_through_density_stages():
    # one step per stage: 25%, 6.25%, 1.5625%, then the method's 1%
    warmup = 2
    ks = [topk_count(ENTRIES, topk_density(0.01, s, 1)) for s in range(4)]
    assert ks == [topk_count(ENTRIES, d) for d in (0.25, 0.0625, 0.015625, 0.01)]
    assert topk_warmup_steps(0.01, warmup, 1) == warmup + 3
    assert topk_warmup_steps(0.3, warmup, 1) == warmup  # above the first stage: no stages
