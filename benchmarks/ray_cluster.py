"""A Ray cluster for a benchmark: the one at an address, or a local one started for it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def local_ray(
    workers: int, address: str | None = None, enabled: bool = True
) -> Iterator[str | None]:
    """The address of the Ray cluster to run on: `address` as given, or a local cluster of a
    head and `workers` 1-CPU nodes (`ray.cluster_utils.Cluster`, real raylets on this machine)
    for the context, shut down after; None when not `enabled`."""
    if not enabled:
        yield None
        return
    if address:
        yield address
        return
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    for _ in range(workers):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    try:
        yield cluster.address
    finally:
        ray.shutdown()
        cluster.shutdown()
