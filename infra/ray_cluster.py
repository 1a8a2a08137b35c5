"""A Ray cluster-launcher configuration for AWS from a cluster spec (`hetflow cluster config`).

One node type per instance type the cluster spec names, with as many nodes as its workers need
(a worker is one GPU, so a g5.12xlarge holds 4), the label the Ray launcher places workers by
(`hetflow.io/instance-type`), and the instance's CPUs and GPUs as its Ray resources, from the
one catalog hetflow reads (`infra.catalog`); a cluster rented on spot (`ClusterSpec.market`)
asks EC2 for spot instances for its worker nodes. The head node takes no training worker (0
CPUs for Ray's scheduler) and stays on-demand, so that an interruption never takes the
cluster's head. Every node gets this checkout (`file_mounts`) and installs it with the `gpu`
and `ray` extras. `ray up CONFIG` brings the cluster up; Ray's own schema checks the file
(`validate`).
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

from hetflow.config import ClusterSpec, ConfigError
from hetflow.infra.catalog import Catalog
from hetflow.infra.pricing import DEFAULT_REGION

NODE_LABEL = "hetflow.io/instance-type"  # as hetflow.training.launch.ray_train places workers
CHECKOUT = Path(__file__).resolve().parents[1]  # the hetflow folder every node gets (editable)
HEAD_INSTANCE = "m5.xlarge"
REMOTE_CHECKOUT = "~/hetflow"


def node_type_name(instance_type: str) -> str:
    """A node type's name in the YAML: the instance type with dots as underscores."""
    return instance_type.replace(".", "_")


def ray_cluster_config(
    cluster: ClusterSpec,
    catalog: Catalog,
    checkout: str | Path = CHECKOUT,
    region: str = DEFAULT_REGION,
    image_id: str | None = None,
) -> dict:
    """The cluster launcher's config (a dict to write as YAML) for `cluster` on AWS in
    `region`; `image_id` the AMI (default: Ray's for the region); `checkout` the local hetflow
    folder every node gets. A ConfigError names a worker without an instance type."""
    bare = [w.name for w in cluster.workers if not w.instance_type]
    if bare:
        raise ConfigError(
            f"cluster.workers[{bare[0]}].instance_type: a cloud cluster needs every worker's "
            "instance type"
        )
    counts = Counter(w.instance_type for w in cluster.workers)
    node_types: dict[str, dict] = {
        "head": {
            "node_config": _node_config(HEAD_INSTANCE, image_id),
            "resources": {"CPU": 0},  # no training worker on the head
            "min_workers": 0,
            "max_workers": 0,
        }
    }
    for instance_type, workers in counts.items():
        info = catalog.info(instance_type)
        nodes = math.ceil(workers / info.devices)
        node_types[node_type_name(instance_type)] = {
            "node_config": _node_config(instance_type, image_id, cluster.market),
            "resources": {"CPU": info.vcpus, **({"GPU": info.gpus} if info.gpus else {})},
            "labels": {NODE_LABEL: instance_type},
            "min_workers": nodes,
            "max_workers": nodes,
        }
    install = f"pip install -e '{REMOTE_CHECKOUT}[gpu,ray]'"
    return {
        "cluster_name": f"hetflow-{cluster.name}".replace("_", "-"),
        "max_workers": sum(t["max_workers"] for t in node_types.values()),
        "provider": {"type": "aws", "region": region},
        "auth": {"ssh_user": "ubuntu"},
        "available_node_types": node_types,
        "head_node_type": "head",
        "file_mounts": {REMOTE_CHECKOUT: str(Path(checkout).resolve())},
        "rsync_exclude": [".venv", "**/.git", "**/__pycache__"],
        "setup_commands": [install],
    }


def _node_config(instance_type: str, image_id: str | None, market: str = "on-demand") -> dict:
    """A node type's EC2 launch parameters; on spot, EC2's market options (RunInstances'
    `InstanceMarketOptions`, which the launcher passes on)."""
    spot = {"InstanceMarketOptions": {"MarketType": "spot"}} if market == "spot" else {}
    return {"InstanceType": instance_type, **({"ImageId": image_id} if image_id else {}), **spot}


def validate(config: dict) -> None:
    """Ray's own check of a cluster-launcher config: its defaults filled for the provider,
    then its JSON schema (`ray.autoscaler._private.util`); raises on a config `ray up` would
    refuse."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(config))


def ray_yaml(cluster: ClusterSpec, checkout: str | Path = CHECKOUT) -> str:
    """The cluster launcher's config of `cluster` as YAML text, its instance types from the
    catalog (`Catalog.for_cluster`), checked by Ray's own schema where Ray is installed (an
    extra: `pip install -e '.[ray]'`)."""
    import yaml

    config = ray_cluster_config(cluster, Catalog.for_cluster(cluster), checkout)
    try:
        import ray  # noqa: F401
    except ImportError:
        pass
    else:
        validate(config)
    return yaml.safe_dump(config, sort_keys=False)
