"""Workers pinned to cores of their own (`WorkerSpec.cpus`): real mixed CPU speeds on one
host. The pinning is checked before launch and seen from inside the ranks."""

from __future__ import annotations

import pytest

from hetflow.config import ConfigError, WorkerSpec
from hetflow.training.cores import core_sets

from tests.helpers.training.cores import _cluster


def test_workers_take_consecutive_cores_in_rank_order_and_the_others_none():
    assert core_sets(_cluster(2, None, 1, 4), [3, 5, 6, 7, 8, 9, 10]) == [
        [3, 5],
        None,
        [6],
        [7, 8, 9, 10],
    ]


def test_more_cores_than_the_host_has_are_refused_in_one_line_naming_the_field():
    with pytest.raises(ConfigError, match=r"^cluster.workers\[\].cpus: 9 cores asked \(w0: 1, "):
        core_sets(_cluster(1, 8), [0, 1, 2, 3])


def test_pinning_under_ray_is_refused_naming_the_worker():
    with pytest.raises(ConfigError, match=r"^cluster.workers\[w1\].cpus: pinning cores needs"):
        core_sets(_cluster(None, 2, launcher="ray"), [0, 1, 2, 3])


def test_cpus_of_zero_is_refused_by_the_config():
    with pytest.raises(ValueError, match="cpus"):
        WorkerSpec(name="w0", cpus=0)
