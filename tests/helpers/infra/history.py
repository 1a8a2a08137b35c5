"""Helpers both halves of test_history.py use: tests/unit/infra/test_history.py and
tests/integration/infra/test_history.py (and any other test module that imports them)."""

from __future__ import annotations

import pytest

from hetflow.config import DatasetSpec, TrainConfig

from tests.profiles import profile_of, rank_profile

TRAIN = TrainConfig(global_batch=32)


def fake_measure():
    """A stand-in for `measure_profile`: each worker at 100 x its speed samples/s, a link of
    its own; `launched` keeps the clusters it measured."""

    def measure(cluster, dataset, train, run_dir, profile_batches=None, placement=None):
        ranks = [
            rank_profile(
                i,
                100.0 * w.speed,
                worker=w.name,
                relative_speed=w.speed / max(v.speed for v in cluster.workers),
                fit_latency_s=0.01,
                grad_bytes=400_000,
                link_gbps=2.0 + i,
                link_latency_s=1e-4 * (i + 1),
                memory_cap_batch=1000 + i,
            )
            for i, w in enumerate(cluster.workers)
        ]
        measure.launched.append((cluster, profile_batches))
        return profile_of(ranks, cluster=cluster.name, profiling_time_s=5.0)

    measure.launched = []
    return measure


@pytest.fixture
def dataset(s3, hetflow_home, request):
    return DatasetSpec(url=f"s3://hetflow-history-{request.node.name[5:30].replace('_', '-')}/d")
