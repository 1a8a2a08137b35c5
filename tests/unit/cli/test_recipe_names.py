"""One name per network across commands: training's `resnet` (a CIFAR ResNet-14) and
recommend's `resnet50` (ResNet-50's published figures). Each command takes the other's name for
the network it has, says in one line what that means, and records its own name."""

from __future__ import annotations

import pytest

from hetflow.cli import main
from hetflow.config import MODEL_ALIASES, RECIPE_ALIASES, RecommendJob, TrainConfig
from hetflow.forecast.rent.rental import model_of
from hetflow.forecast.simulate.models import MODELS


def test_each_model_takes_the_other_commands_name_as_its_own():
    assert TrainConfig(recipe="resnet50").recipe == "resnet"
    assert RecommendJob(recipe="resnet").recipe == "resnet50"
    assert model_of("resnet") is MODELS["resnet50"]
    assert set(RECIPE_ALIASES.values()) <= {"resnet"} and set(MODEL_ALIASES.values()) <= set(MODELS)


def test_recommend_takes_resnet_and_says_it_prices_resnet50(capsys, hetflow_home, tmp_path):
    out = ["-o", str(tmp_path / "c.yaml"), "--ray-config", ""]
    assert main(["recommend", "--recipe", "resnet", "--steps", "100", *out]) == 0
    captured = capsys.readouterr()
    notes = [line for line in captured.err.splitlines() if line.startswith("hetflow: note:")]
    assert notes == [
        "hetflow: note: --recipe resnet: recommend models ResNet-50's published figures "
        "(`resnet50`); `resnet` trains a CIFAR ResNet-14 in demo, train and queue"
    ]
    assert captured.out.startswith("hetflow recommend: resnet50 (")


def test_queue_takes_resnet50_and_says_it_trains_the_resnet14(capsys, hetflow_home):
    # the queue's session writes digits, which the ResNet cannot read: submit refuses it, after
    # the note, naming the recipe the alias stands for
    assert main(["queue", "submit", "r", "--recipe", "resnet50"]) == 2
    note, error = capsys.readouterr().err.splitlines()
    assert note.startswith("hetflow: note: --recipe resnet50: training has no ResNet-50: this ")
    assert "ResNet-14" in note
    assert error.startswith("hetflow: error: --recipe: resnet reads images samples")
    assert not (hetflow_home / "queue/inbox/r.json").exists()


@pytest.mark.parametrize("name, code", [("resnet", 2), ("digits-cnn", 0)])
def test_a_commands_own_name_brings_no_note(capsys, hetflow_home, name, code):
    assert main(["queue", "submit", "own", "--recipe", name]) == code
    assert "note" not in capsys.readouterr().err


def test_simulate_takes_resnet_for_resnet50(capsys):
    from hetflow.cli.simulate import _model

    assert _model("resnet") is MODELS["resnet50"]
    assert capsys.readouterr().err.startswith("hetflow: note: --model resnet: recommend models")
