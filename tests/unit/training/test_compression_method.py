"""The compression grammar, parsed in one place (`CompressionMethod.parse`): bad methods are
refused naming the field, good ones accepted."""

from __future__ import annotations

import re

import pytest

from hetflow.config import ConfigError, TrainConfig, validated
from hetflow.records import CompressionMethod


@pytest.mark.parametrize(
    "value, expected",
    [
        ("gzip", "unknown method"),
        ("POWERSGD:4", "unknown method"),
        ("powersgd", "powersgd needs powersgd:RANK"),
        ("powersgd:0", "powersgd rank must be a whole number >= 1"),
        ("powersgd:-1", "powersgd rank must be a whole number >= 1"),
        ("fp16:2", "fp16 takes no argument"),
        ("topk:0", "topk ratio must be a number in (0, 1]"),
        ("topk:1.5", "topk ratio must be a number in (0, 1]"),
        ("topk:-0.1", "topk ratio must be a number in (0, 1]"),
        ("topk:1e-400", "topk ratio must be a number in (0, 1]"),
        ("topk:nan", "topk ratio must be a number in (0, 1]"),
        ("topk:.", "topk ratio must be a number"),
        ("localsgd:0", "localsgd period must be a whole number >= 1"),
        ("localsgd:-3", "localsgd period must be a whole number >= 1"),
    ],
)
def test_train_config_refuses_bad_methods_naming_the_field(value, expected):
    with pytest.raises(ConfigError) as e:
        validated(TrainConfig, {"compression": value}, "train")
    msg = str(e.value)
    assert msg.startswith("train.compression:") and expected in msg and "\n" not in msg


@pytest.mark.parametrize(
    "value", ["none", "auto", "fp16", "bf16", "powersgd:1", "topk:1", "topk:0.001", "localsgd:1"]
)
def test_train_config_accepts_good_methods(value):
    assert TrainConfig(compression=value).compression == value


@pytest.mark.parametrize(
    "value, expected",
    [
        ("hierarchical:0", "hierarchical period must be a whole number >= 1"),
        ("zip:3", "unknown method"),
        ("topk:2", "topk ratio"),
    ],
)
def test_the_grammar_names_what_is_wrong(value, expected):
    with pytest.raises(ValueError, match=re.escape(expected)):
        CompressionMethod.parse(value)
    with pytest.raises(ConfigError) as e:
        validated(TrainConfig, {"compression": value}, "train")
    assert str(e.value).startswith("train.compression:") and expected in str(e.value)


def test_the_grammar_knows_hierarchical():
    assert CompressionMethod.parse("hierarchical:4") == CompressionMethod(
        name="hierarchical", period=4
    )
    assert CompressionMethod.parse("topk:0.01") == CompressionMethod(name="topk", ratio=0.01)
