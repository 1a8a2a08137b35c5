"""The launcher YAML `hetflow cluster config` writes, brought up by Ray's own autoscaler on this
machine: its fake multi-node provider (`fake_multinode`) starts a local Ray node for each node
the YAML declares, with the YAML's CPUs and labels, and a hetflow job runs on them, each rank on
a node of its worker's instance type.

Not `ray.cluster_utils.AutoscalingCluster`: Ray 2.60's wheel lacks the `example.yaml` it reads
(FileNotFoundError on construction), and its start() and shutdown() run `ray stop --force`, which
kills every Ray process of this user on the machine, other people's clusters included. The
fixture does what its start() does (a head started with the autoscaling config and
RAY_FAKE_CLUSTER=1, the config being example.yaml's fields) on a `Cluster` head of its own, and
ends only the processes it started.
"""

from __future__ import annotations

import json
import time

import pytest

from hetflow.config import ClusterSpec, TrainConfig, WorkerSpec
from hetflow.infra.catalog import Catalog
from hetflow.infra.ray_cluster import NODE_LABEL, node_type_name, ray_cluster_config, validate
from hetflow.infra.s3 import free_port
from hetflow.records import Plan, RunResult
from hetflow.training.launch.ray_train import connect
from hetflow.training.launch.run import run_workers
from hetflow.training.launch.spec import RunSpec

from tests.helpers.training.ray_cluster import CREDENTIALS

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TYPES = ("g5.xlarge", "g4dn.xlarge")
OBJECT_STORE = 150 * 1024 * 1024  # as `Cluster.add_node`'s nodes: small, many share this host


def fake_node_types(config: dict) -> dict:
    """The worker node types of a cluster-launcher `config` as the fake provider's: the same
    names, CPUs, labels and counts. GPUs are left out: the fake nodes are processes on this
    CPU-only machine, and a GPU they advertised would be one nobody has."""
    return {
        name: {
            "resources": {
                **{k: v for k, v in t["resources"].items() if k != "GPU"},
                "object_store_memory": OBJECT_STORE,
            },
            "labels": t["labels"],
            "node_config": {},
            "min_workers": t["min_workers"],
            "max_workers": t["max_workers"],
        }
        for name, t in config["available_node_types"].items()
        if name != config["head_node_type"]
    }


def fake_cluster_config(config: dict, gcs_address: str) -> dict:
    """Ray's fake_multi_node/example.yaml (not in the wheel) with `config`'s worker node types
    and a head of no resources, its nodes joining the head at `gcs_address`."""
    workers = fake_node_types(config)
    commands = ("initialization", "setup", "head_setup", "worker_setup")
    commands += ("head_start_ray", "worker_start_ray")
    return {
        "cluster_name": "fake_multinode",
        "max_workers": sum(t["max_workers"] for t in workers.values()),
        "provider": {
            "type": "fake_multinode",
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
            "gcs_address": gcs_address,
        },
        "available_node_types": {
            "ray.head.default": {"resources": {}, "node_config": {}, "max_workers": 0},
            **workers,
        },
        "head_node_type": "ray.head.default",
        "auth": {},
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": 0.1,
        "docker": {},
        **{f"{c}_commands": [] for c in commands},
        "file_mounts": {},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
    }


def _cluster_spec(address: str | None = None) -> ClusterSpec:
    workers = [WorkerSpec(name=t.split(".")[0], instance_type=t) for t in TYPES]
    return ClusterSpec(name="fake", workers=workers, launcher="ray", ray_address=address)


def _wait_for_labels(deadline_s: float) -> list[dict]:
    """The alive nodes once a node of every type in TYPES is among them."""
    deadline = time.monotonic() + deadline_s
    while True:
        alive = [n for n in ray.nodes() if n["Alive"]]
        if {n["Labels"].get(NODE_LABEL) for n in alive} >= set(TYPES):
            return alive
        if time.monotonic() > deadline:
            have = [n["Labels"].get(NODE_LABEL, "unlabelled") for n in alive]
            raise TimeoutError(f"the autoscaler started no node of each of {TYPES}: {have}")
        time.sleep(0.5)


def _end_processes(procs) -> None:
    """Terminate those of `procs` (psutil processes) still running, then kill what is left."""
    import psutil

    alive = [p for p in procs if p.is_running()]
    for p in alive:
        p.terminate()
    _, left = psutil.wait_procs(alive, timeout=10)
    for p in left:
        p.kill()
    psutil.wait_procs(left, timeout=5)


@pytest.fixture(scope="module")
def autoscaled(s3_server, tmp_path_factory):
    """A head of no resources whose autoscaler runs the fake provider on hetflow's launcher
    YAML; yields (cluster, the YAML as hetflow wrote it, the alive nodes)."""
    import psutil
    from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_ID
    from ray.cluster_utils import Cluster

    config = ray_cluster_config(_cluster_spec(), Catalog.for_cluster(_cluster_spec()), ".")
    validate(config)  # the file `ray up` would take
    port = free_port()
    path = tmp_path_factory.mktemp("autoscaler") / "fake-cluster.json"
    gcs = f"{ray.util.get_node_ip_address()}:{port}"
    path.write_text(json.dumps(fake_cluster_config(config, gcs)))
    # the autoscaler (Ray's monitor) and the nodes it starts inherit this environment
    inherited = {**CREDENTIALS, "AWS_ENDPOINT_URL": s3_server, "RAY_FAKE_CLUSTER": "1"}
    inherited["AUTOSCALER_UPDATE_INTERVAL_S"] = "1"
    head = {"num_cpus": 0, "gcs_server_port": port, "autoscaling_config": str(path)}
    head["env_vars"] = {"RAY_OVERRIDE_NODE_ID_FOR_TESTING": FAKE_HEAD_NODE_ID}
    with pytest.MonkeyPatch.context() as env:
        for k, v in inherited.items():
            env.setenv(k, v)
        cluster = Cluster(initialize_head=True, head_node_args=head)
        monitor = cluster.head_node.all_processes["monitor"][0].process.pid
        try:
            connect(cluster.address)
            yield cluster, config, _wait_for_labels(120)
        finally:
            # the nodes the autoscaler started are its children, not the head's: end them by
            # id once the head (and the autoscaler with it) is down, so none is started again
            try:
                started = psutil.Process(monitor).children(recursive=True)
            except psutil.NoSuchProcess:  # the autoscaler died: nothing of it to find
                started = []
            ray.shutdown()
            cluster.shutdown()
            _end_processes(started)


def test_the_autoscaler_starts_the_declared_nodes_and_a_job_runs_on_them(
    autoscaled, digits, tmp_path
):
    cluster, config, nodes = autoscaled
    types = config["available_node_types"]
    for n in nodes:
        if NODE_LABEL in n["Labels"]:  # a started node has its type's CPUs
            declared = types[node_type_name(n["Labels"][NODE_LABEL])]["resources"]
            assert n["Resources"]["CPU"] == declared["CPU"]
    per_type = [sum(n["Labels"].get(NODE_LABEL) == t for n in nodes) for t in TYPES]
    assert per_type == [types[node_type_name(t)]["min_workers"] for t in TYPES] == [1, 1]
    train = TrainConfig(recipe="digits-mlp", global_batch=32, steps=4, eval_every=2)
    spec = RunSpec(
        run_name="autoscaled",
        variant="autoscaled",
        cluster=_cluster_spec(cluster.address),
        dataset=digits,
        train=train,
        plan=Plan.equal([16, 16]),
        run_dir=str(tmp_path / "autoscaled"),
    )
    result, _ = run_workers(spec, timeout_s=250)
    labels = {n["NodeID"]: n["Labels"].get(NODE_LABEL) for n in ray.nodes()}
    run = RunResult.model_validate(result)
    assert [labels[r.node] for r in run.ranks] == list(TYPES)
    assert [r.step for r in run.lead.records][-1] == train.steps - 1
