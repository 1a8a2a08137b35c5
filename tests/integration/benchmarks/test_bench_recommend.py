"""`hetflow bench recommend`: the naive choices, the emulated clock and link, the figures that
compare measured with predicted (pure), and one short run (slow)."""

from __future__ import annotations

import json

import pytest

from benchmarks.recommend import main


@pytest.mark.slow
def test_one_short_run_reports_every_choice_measured_against_its_prediction(tmp_path):
    out = tmp_path / "rec.json"
    argv = ["--candidates", "g4dn.xlarge:1,p3.2xlarge:1", "--deadline-h", "3"]
    main([*argv, "--global-batch", "192", "--run-steps", "8", "--json", str(out)])
    figures = json.loads(out.read_text())
    assert set(figures["choices"]) == {"recommended", "all-cheapest", "all-fastest", "equal-counts"}
    for row in figures["choices"].values():
        assert row["k"] > 0 and row["measured_step_s"] == pytest.approx(
            row["emulated_step_s"] * row["k"]
        )
        assert row["measured_cost_usd"] / row["predicted_cost_usd"] == pytest.approx(
            row["measured_hours"] / row["predicted_hours"]
        )
    assert figures["max_abs_error"] >= abs(figures["choices"]["recommended"]["hours_error"])
