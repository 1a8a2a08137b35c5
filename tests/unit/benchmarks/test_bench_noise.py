"""`hetflow bench noise`: the step-noise figures the emulator's defaults come from."""

from __future__ import annotations

import pytest


def test_step_noise_separates_jitter_from_pauses():
    from benchmarks.noise import SKIP, step_noise

    steady = [1.0, 1.02, 0.98] * 20
    f = step_noise([9.0] * SKIP + steady + [3.0, 2.5])  # the cold first steps are skipped
    assert f["steps"] == len(steady) + 2
    assert f["pause_share"] == pytest.approx(2 / f["steps"], abs=1e-4)
    assert f["pause_length"] == pytest.approx(2.75, abs=0.01)
    assert 0 < f["cv"] < 0.05  # the pauses do not inflate the jitter
