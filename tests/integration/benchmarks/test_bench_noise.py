"""`hetflow bench noise`: the step-noise figures the emulator's defaults come from."""

from __future__ import annotations

import json

import pytest

from hetflow.cli import main as cli_main


@pytest.mark.slow
def test_bench_noise_times_real_pinned_workers(tmp_path, hetflow_home):
    path = tmp_path / "noise.json"
    assert cli_main(["bench", "noise", "--ranks", "1", "--steps", "30", "--json", str(path)]) == 0
    (rank,) = json.loads(path.read_text())["ranks"]
    assert rank["steps"] == 25 and rank["median_s"] > 0 and rank["cv"] >= 0
