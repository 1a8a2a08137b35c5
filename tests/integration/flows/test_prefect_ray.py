"""A `train` deployment run, triggered through the Prefect API as the UI does, trains on a Ray
cluster of labelled nodes with a Prefect worker that is not on the Ray head node.

On one machine: this test process starts the Ray cluster (`ray.cluster_utils.Cluster`: the head
and one node per instance type, each labelled `hetflow.io/instance-type`), so the head is this
process's and this process never joins the cluster as a driver. The flow run is executed by a
Prefect process worker, a different process started here with the stack's exports only; its flow
run joins the cluster by the address given in the run's `cluster` parameter, as a Ray driver
from outside the head, as a worker on another host does. The stack and the deployments are
test_stack_and_deploy's fixtures (its own stack, for this module). A few minutes on 2 cores.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest

from hetflow.training.launch.ray_train import NODE_LABEL

from tests.integration.flows.test_stack_and_deploy import deployed, stack, start_worker, stop_worker  # noqa: F401 (fixtures)

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

WORKERS = [  # not in the nodes' order: rank r must land on its own type
    {"name": "v100", "instance_type": "p3.2xlarge", "speed": 2.0},
    {"name": "t4", "instance_type": "g4dn.xlarge", "speed": 1.0},
    {"name": "a10g", "instance_type": "g5.xlarge", "speed": 3.0},
]
TRAIN = {
    "recipe": "digits-mlp",
    "steps": 6,
    "global_batch": 48,
    "eval_every": 3,
    "checkpoint_every": 3,
    "schedule": "equal",  # no rank left out of the launch: every worker's node is used
}


@pytest.fixture(scope="module")
def ray_nodes(stack):  # noqa: F811
    """The Ray cluster: a 1-CPU head and one 1-CPU node per instance type of `WORKERS`. The
    nodes inherit this process's environment when they start: the stack's S3 endpoint and its
    local credentials are set in it first, and restored after."""
    from ray.cluster_utils import Cluster

    inherited = {k: v for k, v in stack["exports"].items() if k.startswith("AWS_")}
    env = pytest.MonkeyPatch()  # module-scoped: undone after the cluster is down
    for k, v in inherited.items():
        env.setenv(k, v)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        for w in WORKERS:
            cluster.add_node(num_cpus=1, labels={NODE_LABEL: w["instance_type"]})
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()
        env.undo()


def _run_on_a_worker(stack, run_id, tmp_path, wait_s: float = 480):  # noqa: F811
    """Start a process worker (the stack's exports, no Ray variables), wait for the flow run to
    end, stop the worker; (the flow run, the worker's log tail)."""
    from prefect.client.orchestration import SyncPrefectClient

    env = {**stack["env"], **stack["exports"], "PREFECT_WORKER_QUERY_SECONDS": "2"}
    for k in ("RAY_ADDRESS", "HETFLOW_LAUNCHER"):
        env.pop(k, None)
    log_path = tmp_path / "worker.log"
    with log_path.open("w") as log:
        worker = start_worker(stack, env, log)
        try:
            with SyncPrefectClient(stack["exports"]["PREFECT_API_URL"]) as client:
                deadline = time.monotonic() + wait_s
                run = client.read_flow_run(run_id)
                while not (run.state and run.state.is_final()) and time.monotonic() < deadline:
                    time.sleep(1.0)
                    run = client.read_flow_run(run_id)
        finally:
            stop_worker(worker)
    return run, log_path.read_text(errors="replace")[-6000:]


def test_a_train_deployment_run_from_the_api_completes_on_the_ray_cluster(
    stack,  # noqa: F811
    deployed,  # noqa: F811
    ray_nodes,
    tmp_path,
):
    from mlflow import MlflowClient
    from prefect.client.orchestration import SyncPrefectClient

    ex = stack["exports"]
    dataset = {"url": f"s3://hetflow-prefect-ray/digits-{uuid.uuid4().hex[:6]}"}
    cluster = {
        "name": "three-types",
        "launcher": "ray",
        "ray_address": ray_nodes.address,
        "time_scale": 2,
        "workers": WORKERS,
    }
    with SyncPrefectClient(ex["PREFECT_API_URL"]) as client:
        dep = client.read_deployment_by_name("train/train")
        schema = dep.parameter_openapi_schema["definitions"]["ClusterBlock"]["properties"]
        assert {"launcher", "ray_address"} <= set(schema)  # the form's fields
        run = client.create_flow_run_from_deployment(
            dep.id,
            parameters={"cluster": cluster, "dataset": dataset, "train": TRAIN, "variant": "ray"},
        )
    run, tail = _run_on_a_worker(stack, run.id, tmp_path)
    assert run.state is not None and run.state.is_completed(), (
        f"the flow run ended {run.state and run.state.type}: {run.state and run.state.message}"
        f"\n{tail}"
    )

    mlflow = MlflowClient(ex["MLFLOW_TRACKING_URI"])
    exp = mlflow.get_experiment_by_name("hetflow")
    (found,) = mlflow.search_runs([exp.experiment_id], f"tags.prefect_flow_run_id = '{run.id}'")
    assert found.info.status == "FINISHED" and found.data.tags["variant"] == "ray"
    params, metrics = found.data.params, found.data.metrics
    assert params["cluster.launcher"] == "ray"
    assert params["cluster.ray_address"] == ray_nodes.address
    assert metrics["throughput_samples_per_s"] > 0
    assert metrics["comm_bytes_total"] > 0, params.get("plan.dropped")  # the 3 ranks all-reduced

    # rank r ran on a node labelled with worker r's instance type: the run's result in S3
    # (the dataset's bucket, where the flow run read it), and each of those nodes sampled its
    # own system metrics into the MLflow run
    from tests.integration.flows.test_stack_and_deploy import _s3

    labels = {n.node_id: n.node_labels.get(NODE_LABEL) for n in ray_nodes.worker_nodes}
    bucket = dataset["url"].removeprefix("s3://").split("/", 1)[0]
    key = f"runs/{run.id}-ray/result.json"
    result = json.loads(_s3(ex).get_object(Bucket=bucket, Key=key)["Body"].read())
    nodes = [r["node"] for r in result["ranks"]]
    assert [labels.get(n) for n in nodes] == [w["instance_type"] for w in WORKERS]
    reported = {k.split("/")[1] for k in metrics if k.endswith("/cpu_utilization_percentage")}
    assert set(nodes) <= reported, (nodes, reported)
