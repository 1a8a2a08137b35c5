"""The strategies as plug-ins (`training.loop.strategies`): a registry of builders that the
loop asks by `train.strategy`, each entry building a rank's model and optimizer and its loop
step on real ranks."""

from __future__ import annotations

import pytest

from hetflow.config import TrainConfig
from hetflow.training.loop.strategies import STRATEGIES, Strategy, register_strategy, strategy_of


def test_an_unknown_strategy_is_refused_in_one_line_naming_train_strategy():
    with pytest.raises(ValueError) as refused:
        strategy_of("zero3")
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("train.strategy: 'zero3'")
    assert "ddp, diloco, fsdp" in message


def test_the_built_in_strategies_are_the_registry_entries_the_config_offers():
    offered = TrainConfig.model_fields["strategy"].annotation.__args__
    assert sorted(STRATEGIES) == sorted(offered)
    assert all(strategy_of(name).name == name for name in offered)


def test_a_name_is_registered_once():
    ddp = strategy_of("ddp")
    with pytest.raises(ValueError, match="'ddp' is already registered"):
        register_strategy(Strategy("ddp", ddp.build_net, ddp.build_stepper))
    assert STRATEGIES["ddp"] is ddp
