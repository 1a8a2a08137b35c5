"""Repeated comparisons (`hetflow.repeats`): the order of each round, a figure's own median."""

from __future__ import annotations

import pytest

from hetflow.repeats import median_spread, run_order, with_medians


def test_round_0_runs_the_variants_in_the_order_given():
    assert run_order(["baseline", "static", "dynamic"], 0) == ["baseline", "static", "dynamic"]


@pytest.mark.parametrize("names", [["a", "b"], ["a", "b", "c"], ["a", "b", "c", "d", "e"]])
def test_over_as_many_rounds_as_variants_each_runs_first_once_and_every_round_runs_all(names):
    orders = [run_order(names, r) for r in range(len(names))]
    assert sorted(o[0] for o in orders) == sorted(names)
    assert all(sorted(o) == sorted(names) for o in orders)


def test_two_variants_alternate_which_runs_first():
    firsts = [run_order(["baseline", "optimized"], seed)[0] for seed in range(4)]
    assert firsts == ["baseline", "optimized", "baseline", "optimized"]


def test_the_median_is_of_the_values_measured_with_their_min_and_max():
    assert median_spread([5.0, None, 1.0, 3.0]) == (3.0, [1.0, 5.0])
    assert median_spread([4.0, 1.0]) == (2.5, [1.0, 4.0])  # even count: the middle two's mean
    assert median_spread([None, None]) == (None, None)


def test_each_figure_is_its_own_median_and_the_row_given_is_left_as_it_was():
    runs = [{"tp": 10.0, "e2e": 30.0}, {"tp": 30.0, "e2e": 10.0}, {"tp": 20.0, "e2e": 50.0}]
    row = dict(runs[2])
    out = with_medians(row, runs, ["tp", "e2e", "absent"])
    # the median end to end is not the end to end of the run of median throughput (50.0)
    assert out["tp"] == 20.0 and out["e2e"] == 30.0
    assert out["tp_range"] == [10.0, 30.0] and out["e2e_range"] == [10.0, 50.0]
    assert "absent" not in out and row == runs[2]
