"""Workers lost from a running job under `faults.on_loss: continue`, on real processes: the
ranks left keep their processes and state, regroup, re-cut the global batch over themselves and
go on from the step they were at; no step is redone or half-applied, and no case hangs."""

from __future__ import annotations

import pytest

from hetflow.config import ConfigError, TrainConfig
from hetflow.config.base import validated
from hetflow.training.elastic.launch import check_elastic

from tests.helpers.training.elastic import _spec


def test_bad_on_loss_is_one_line_naming_the_field():
    with pytest.raises(ConfigError, match="faults.on_loss") as e:
        validated(TrainConfig, {"recipe": "digits-mlp", "faults": {"on_loss": "hope"}}, "train.")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "change, word",
    [({"strategy": "fsdp"}, "strategy"), ({"compression": "powersgd:2"}, "compression")],
)
def test_what_continue_cannot_run_is_refused_before_launch(local_digits, tmp_path, change, word):
    spec = _spec(local_digits, tmp_path / "r")
    spec = spec.model_copy(update={"train": spec.train.model_copy(update=change)})
    with pytest.raises(ConfigError, match=f"on_loss: 'continue' needs {word}"):
        check_elastic(spec)
