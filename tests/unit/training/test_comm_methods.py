"""The communication methods on real gloo ranks: the bytes each sends, replicas kept in sync,
warm-ups, local SGD's averaging, hierarchical traffic kept off the link.

Each method trains a tiny MLP a few steps on 4 ranks (`tests.dist`), in a launch of its own
(a module fixture per method, so that one method's failure fails its own tests only), and
reports what `WireCounter` charged per step; the tests compare that with the bytes each
algorithm must send.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hetflow.records import METHOD_NAMES
from hetflow.training.comm import (
    METHODS,
    SampleWeightedAverager,
    finish_optimizer,
    method_warmup_steps,
)

# ---------------------------------------------------------------------------------------------
# local SGD's weights (pure: the averaging's all-reduce replaced by a record of the weights)


class _Weights(SampleWeightedAverager):
    def __init__(self, period: int, warmup: int, rank: int = 0, mates=(0,)) -> None:
        super().__init__(period, warmup, rank, list(mates), process_group=object())
        self.averaged: list[tuple[int, float | None]] = []  # (step, this rank's weight)

    def _average(self, params, weight) -> None:
        self.averaged.append((self.step, weight))


def _steps(averager, own: list[int], totals: list[int]) -> list[tuple[int, float | None]]:
    for n, total in zip(own, totals, strict=True):
        averager.trained(n, total)
        averager.average_parameters([])
    return averager.averaged


def test_a_rank_weighs_its_samples_since_the_last_average_over_everyones():
    # warm-up 2, period 3: averages after steps 2 and 5; the warm-up's samples do not count
    got = _steps(_Weights(3, 2), [9, 9, 1, 2, 3, 4, 0], [20, 20, 10, 10, 10, 20, 20])
    assert got == [(2, 1 / 10), (5, (2 + 3 + 4) / (10 + 10 + 20))]
    left_out = _steps(_Weights(2, 0), [0, 0, 0, 5], [8, 8, 8, 8])
    assert left_out == [(0, 0.0), (2, 0.0)]  # batch 0 since the last average: weight 0


def test_the_last_average_weighs_the_steps_since_the_previous_one_and_only_if_any():
    avg = _Weights(4, 0)
    _steps(avg, [1, 3, 3], [4, 4, 4])  # averaged after step 0; steps 1 and 2 drift apart
    finish_optimizer(SimpleNamespace(averager=avg), torch.nn.Linear(1, 1))
    assert avg.averaged == [(0, 1 / 4), (3, 6 / 8)]
    finish_optimizer(SimpleNamespace(averager=avg), torch.nn.Linear(1, 1))  # nothing new
    assert len(avg.averaged) == 2
    assert _steps(_Weights(2, 0), [2], [0]) == [(0, None)]  # nothing noted: equal weights


def test_a_local_step_is_each_rank_s_own_mean_and_a_node_s_over_its_samples():
    alone = _Weights(2, 0, rank=1, mates=[1])
    assert alone.loss_scale(count=48, plan=[4, 6, 2]) == 1 / 48  # 6 samples of 8 tokens
    assert alone.loss_scale(count=0, plan=[4, 0, 2]) == 0.0
    node = _Weights(2, 0, rank=1, mates=[0, 1])  # its mate's gradient is averaged with its own
    k, mine, theirs = 2, 6, 4
    assert node.loss_scale(count=6, plan=[4, 6, 2]) == pytest.approx(k * mine / (10 * 6))
    # the intra-node mean of both ranks' scaled sums is their summed losses over 10 samples
    assert (k * theirs / (10 * 4) + k * mine / (10 * 6)) / k == pytest.approx(2 / 10)
    assert _Weights(2, 2).local() is False


# ---------------------------------------------------------------------------------------------
# the registry


def test_the_registry_has_every_method_of_the_grammar():
    assert set(METHODS) == set(METHOD_NAMES)


def test_methods_are_taken_parsed_not_as_text():
    with pytest.raises(TypeError, match="CompressionMethod"):
        method_warmup_steps("powersgd:4")
