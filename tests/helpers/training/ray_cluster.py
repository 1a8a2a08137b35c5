"""A Ray cluster of labelled nodes on this machine (`ray.cluster_utils.Cluster`), for the
modules that start one: the S3 credentials and endpoint the nodes inherit from the driver's
environment, then a 1-CPU head and one 1-CPU node per instance type."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

CREDENTIALS = {  # what the `s3` fixture sets: the nodes inherit them when they start
    "AWS_ACCESS_KEY_ID": "testing-key-id",
    "AWS_SECRET_ACCESS_KEY": "testing-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def labelled_cluster(s3_server: str, types: Sequence[str]) -> Iterator[object]:
    """Yield a cluster whose worker nodes carry `types` (one node each, labelled under
    `NODE_LABEL`), this process its driver; shut down and the environment restored after."""
    import ray
    from ray.cluster_utils import Cluster

    from hetflow.training.launch.ray_train import NODE_LABEL, connect

    # the driver's own node id (its system metrics' host name), which the nodes inherit when
    # they start from its environment: each node must name itself all the same
    inherited = {**CREDENTIALS, "AWS_ENDPOINT_URL": s3_server}
    inherited["MLFLOW_SYSTEM_METRICS_NODE_ID"] = "driver-host"
    env = pytest.MonkeyPatch()  # module-scoped: undone after the cluster is down
    for k, v in inherited.items():
        env.setenv(k, v)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    for t in types:
        cluster.add_node(num_cpus=1, labels={NODE_LABEL: t})
    cluster.wait_for_nodes()
    connect(cluster.address)
    yield cluster
    ray.shutdown()
    cluster.shutdown()
    env.undo()
