"""The train flow trains with the TrainConfig it is given (the Prefect form's "Batch schedule"
and "Gradient communication" included); `hetflow train --variant` applies the preset first."""

from __future__ import annotations

import pytest

from hetflow.config import TrainConfig
from hetflow.flows.train import run_label


def test_run_label_names_a_preset_or_the_schedule_and_compression():
    assert run_label(TrainConfig.variant("baseline", steps=7)) == "baseline"
    assert run_label(TrainConfig.variant("optimized", recipe="digits-mlp")) == "optimized"
    assert run_label(TrainConfig(schedule="equal", compression="fp16")) == "equal+fp16"
    assert run_label(TrainConfig()) == "dynamic+none"  # the form's defaults are no preset


@pytest.mark.parametrize("variant", ["baseline", "optimized"])
def test_cli_train_applies_the_variant_preset(variant, monkeypatch):
    import hetflow.flows.train
    from hetflow.cli import main

    seen = {}

    def fake_flow(**kw):
        seen.update(kw)
        return {"run_id": "r", "metrics": {}}

    monkeypatch.setattr(hetflow.flows.train, "train", fake_flow)
    assert main(["train", "--variant", variant, "--steps", "7", "--recipe", "digits-mlp"]) == 0
    assert seen["train"] == TrainConfig.variant(variant, steps=7, recipe="digits-mlp")
    assert seen["variant"] == variant
