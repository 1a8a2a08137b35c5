"""Clusters and datasets as Prefect blocks, against a real Prefect API (the
session's `prefect_test_harness`): the demo's blocks saved once, picked by a run's form as a
reference the flow loads, validated as a cluster file is, and edited without losing a rule."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from hetflow.config import ClusterSpec, ConfigError, default_cluster, validated
from hetflow.flows.blocks import ClusterBlock
from hetflow.flows.train import train


def test_a_cluster_file_or_model_still_works_where_a_block_is_taken():
    as_file = default_cluster().model_dump(mode="json")
    for given in (as_file, default_cluster()):
        ran = train.validate_parameters({"cluster": given})["cluster"]
        assert type(ran) is ClusterSpec and ran == default_cluster()


def test_a_blocks_rules_are_the_cluster_files_with_the_same_one_line_error():
    bad = {"name": "x", "workers": [{"name": "a"}, {"name": "a"}]}
    with pytest.raises(ConfigError) as from_file:
        validated(ClusterSpec, bad, "cluster")
    with pytest.raises(ConfigError) as as_block:
        validated(ClusterBlock, bad, "cluster")
    assert str(as_block.value) == str(from_file.value)
    assert "worker name 'a' appears twice" in str(from_file.value)
    with pytest.raises(ValidationError, match="Extra inputs"):
        ClusterBlock(name="x", workers=[{"name": "a"}], typo=1)
