"""`hetflow simulate` end to end (no calibration runs): JSON shape, plot, bad input."""

from __future__ import annotations

import json

import pytest

from hetflow.cli.simulate import main
from hetflow.config import ConfigError

ROW_KEYS = {
    "workers",
    "plan",
    "throughput_samples_per_s",
    "efficiency",
    "epoch_time_s",
    "cost_per_epoch",
}


def test_mix_writes_rows_for_every_count_and_plan(s3, tmp_path):
    path = tmp_path / "sim.json"
    png = tmp_path / "sim.png"
    rc = main(
        [
            "--mix",
            "g4dn.xlarge:2,g5.xlarge:1,p3dn.24xlarge:1",
            "--model",
            "resnet50",
            "--workers",
            "1,4,16,1024",
            "--json",
            str(path),
            "--plot",
            str(png),
        ]
    )
    assert rc == 0
    out = json.loads(path.read_text())
    rows = out["rows"]
    assert [(r["workers"], r["plan"]) for r in rows] == [
        (n, p) for n in (1, 4, 16, 1024) for p in ("baseline", "optimized")
    ]
    for r in rows:
        assert ROW_KEYS <= set(r)
        assert r["throughput_samples_per_s"] > 0 and 0 < r["efficiency"] <= 1 + 1e-9
        assert r["epoch_time_s"] > 0 and r["cost_per_epoch"] > 0
    by = {(r["workers"], r["plan"]): r for r in rows}
    assert by[(1, "baseline")]["efficiency"] == pytest.approx(1.0)
    for n in (4, 16, 1024):
        assert (
            by[(n, "optimized")]["throughput_samples_per_s"]
            >= by[(n, "baseline")]["throughput_samples_per_s"]
        )
    assert out["cluster"]["workers_at_1024"] and out["model"]["params"] == 25_600_000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_input_is_refused_with_a_clear_error(s3, tmp_path):
    with pytest.raises(ConfigError, match="--model"):
        main(["--mix", "g5.xlarge:1", "--model", "gpt-9"])
    with pytest.raises(ConfigError, match="--workers"):
        main(["--mix", "g5.xlarge:1", "--workers", "0,4"])
    with pytest.raises(ConfigError, match="g9.enormous"):
        main(["--mix", "g9.enormous:2"])
    with pytest.raises(ConfigError, match="--fraction"):
        main(["--mix", "g5.xlarge:1", "--fraction", "2"])
    bare = tmp_path / "cluster.yaml"
    bare.write_text("workers:\n  - {name: a, speed: 1}\n")
    with pytest.raises(ConfigError, match="instance_type"):
        main(["--cluster", str(bare)])
    with pytest.raises(ConfigError, match="--calibrate-steps"):  # refused before any run
        main(["--calibrate", "--calibrate-steps", "3"])


def test_the_cli_hands_simulate_its_own_flags(s3, tmp_path, capsys):
    from hetflow.cli import main as hetflow

    path = tmp_path / "cli.json"
    assert (
        hetflow(["simulate", "--mix", "g4dn.xlarge:2", "--workers", "1,2", "--json", str(path)])
        == 0
    )
    assert {r["workers"] for r in json.loads(path.read_text())["rows"]} == {1, 2}
    with pytest.raises(SystemExit):
        hetflow(["simulate", "--help"])
    assert "--mix" in capsys.readouterr().out
