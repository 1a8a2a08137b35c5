"""`hetflow recommend --profiles`: a type profiled on its own hardware gets its measured
step-time curve and memory cap. The history is written by the real `profile_or_reuse` (its
torchrun profile replaced, as in test_history.py) to real S3 over moto's HTTP server, and read
back by the real command."""

from __future__ import annotations

import pytest

from hetflow.forecast.rent.measured import MeasuredCurve

pytestmark = pytest.mark.timeout(240)


def test_a_measured_curve_is_the_profiles_line_up_to_its_memory_cap():
    curve = MeasuredCurve(latency_s=0.02, per_sample_s=0.001, cap=100, source="x")
    steps = curve.steps(2048)
    assert len(steps) == 100 and steps[0] == pytest.approx(0.021)
    assert steps[-1] == pytest.approx(0.12) and list(steps) == sorted(steps)
    assert len(MeasuredCurve(0.0, 0.001, None, "x").steps(64)) == 64
