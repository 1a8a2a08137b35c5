"""`hetflow bench lr_rule`, small: each batch runs the same epochs under each variant of the
rule, at the lr a run would train at."""

from __future__ import annotations

import json

import pytest

from hetflow.cli import main as cli_main


def test_bench_lr_rule_trains_each_variant_the_same_epochs_at_the_rules_lr(tmp_path):
    path = tmp_path / "lr.json"
    argv = ["--batches", "128,256", "--epochs", "0.5", "--warmup", "2", "--json", str(path)]
    assert cli_main(["bench", "lr_rule", *argv]) == 0
    rows = json.loads(path.read_text())["rows"]
    assert [(r["batch"], r["variant"]) for r in rows] == [
        (b, v) for b in (128, 256) for v in ("none", "sqrt, no warm-up", "sqrt, warm-up 2")
    ]
    by = {(r["batch"], r["variant"]): r for r in rows}
    assert by[(256, "none")]["lr_scaled"] == pytest.approx(0.05)  # the recipe's, as given
    assert by[(256, "sqrt, warm-up 2")]["lr_scaled"] == pytest.approx(0.05 * 2**0.5)
    assert by[(128, "none")]["steps"] == 2 * by[(256, "none")]["steps"]  # the same epochs
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in rows)
