"""`hetflow bench hetero`'s pure pieces (the benchmark itself is measured, not tested)."""

from __future__ import annotations

import pytest

from benchmarks.hetero import compute_model_error


def test_compute_model_error_compares_measured_compute_with_the_plans_model():
    def rec(step, batch, compute_s):
        return {"step": step, "batch": batch, "compute_s": compute_s}

    result = {"ranks": [
        # rank 1 first: ranks are matched by number, not by position
        {"rank": 1, "records": [rec(0, 4, 9.0), rec(1, 4, 0.12), rec(2, 4, 0.14), rec(3, 6, 0.5)]},
        {"rank": 0, "records": [rec(0, 2, 9.0), rec(1, 2, 0.05), rec(2, 2, 0.05), rec(3, 2, 5.0)]},
    ]}
    # planned: rank 0 0.01 + 0.02 x 2 = 0.05; rank 1 0.02 + 0.02 x 4 = 0.10
    errors = compute_model_error(result, [2, 4], [0.01, 0.02], [0.02, 0.02], until_step=3)
    # step 0 (set-up) and steps from until_step on (a straggler) are left out; so is a step
    # whose batch is not the plan's (a re-plan)
    assert errors == [pytest.approx(0.0), pytest.approx(0.3)]
    assert compute_model_error(result, [3, 4], [0.01, 0.02], [0.02, 0.02], until_step=3)[0] is None
