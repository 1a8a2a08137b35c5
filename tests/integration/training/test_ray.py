"""The Ray launcher on a real Ray cluster of 3 labelled nodes on this machine
(`ray.cluster_utils.Cluster`, started once for the module): placement by instance type, the
same weights as torchrun, state in S3, a lost node survived with a replacement and without
one, and bad input refused before anything is placed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from hetflow.config import ClusterSpec, ConfigError, TrainConfig, WorkerSpec
from hetflow.infra.s3 import filesystem
from hetflow.records import Plan, RunResult
from hetflow.training.cpu_quota import find_controller
from hetflow.training.launch.ray_train import NODE_LABEL, connect, label_selectors
from hetflow.training.launch.run import run_workers
from hetflow.training.launch.spec import RunSpec

from tests.helpers.training.ray_cluster import labelled_cluster

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TYPES = ("g4dn.xlarge", "g5.xlarge", "p3.2xlarge")


@pytest.fixture(scope="module")
def ray_cluster(s3_server):
    """A head without CPUs for workers and one 1-CPU node per instance type, labelled."""
    yield from labelled_cluster(s3_server, TYPES)


def _spec(dataset, tmp_path, name: str, launcher: str, address=None) -> RunSpec:
    workers = [  # not in the nodes' order: rank r must land on its own type
        WorkerSpec(name="v100", instance_type="p3.2xlarge", speed=2.0),
        WorkerSpec(name="t4", instance_type="g4dn.xlarge", speed=1.0),
        WorkerSpec(name="a10g", instance_type="g5.xlarge", speed=3.0),
    ]
    cluster = ClusterSpec(workers=workers, launcher=launcher, ray_address=address, time_scale=2)
    train = TrainConfig(
        recipe="digits-mlp",
        global_batch=48,
        steps=6,
        schedule="proportional",
        eval_every=3,
        checkpoint_every=3,
    )
    return RunSpec(
        run_name=name,
        variant=name,
        cluster=cluster,
        dataset=dataset,
        train=train,
        plan=Plan.equal([16, 8, 24]),
        run_dir=str(tmp_path / name),
    )


def test_ray_places_ranks_by_type_matches_torchrun_and_keeps_state_in_s3(
    ray_cluster, digits, tmp_path
):
    on_ray = _spec(digits, tmp_path, "on-ray", "ray", ray_cluster.address)
    result, _ = run_workers(on_ray, timeout_s=250)
    labels = {n["NodeID"]: n["Labels"].get(NODE_LABEL) for n in ray.nodes()}
    ranks = RunResult.model_validate(result).ranks
    assert [labels[r.node] for r in ranks] == [w.instance_type for w in on_ray.cluster.workers]
    # the state went to the dataset's bucket, where the driver read it
    bucket = digits.url.removeprefix("s3://").split("/", 1)[0]
    fs, path = filesystem(f"s3://{bucket}/runs/on-ray/result.json")
    assert fs.exists(path) and fs.exists(path.replace("result.json", "checkpoints"))
    local = _spec(digits, tmp_path, "on-torchrun", "local")
    run_workers(local, timeout_s=250)
    a = torch.load(Path(on_ray.run_dir) / "model.pt")
    b = torch.load(Path(local.run_dir) / "model.pt")
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=0)


@pytest.mark.skipif(
    find_controller() is None or not os.access(find_controller().root, os.W_OK),
    reason="no writable cgroup CPU controller on this host (needs root and cgroup v1/v2 'cpu')",
)
def test_on_ray_each_rank_runs_under_its_cpu_quota_and_the_cgroups_go(
    ray_cluster, digits, tmp_path
):
    spec = _spec(digits, tmp_path, "quotas-on-ray", "ray", ray_cluster.address)
    workers = spec.cluster.workers
    for w, q in zip(workers, (0.5, None, 0.25), strict=True):
        w.cpu_quota = q
    result, _ = run_workers(spec, timeout_s=250)
    ranks = sorted(RunResult.model_validate(result).ranks, key=lambda r: r.rank)
    assert [r.cpu_quota for r in ranks] == [0.5, None, 0.25]  # as the kernel says, per rank
    assert not find_controller().job_dir("quotas-on-ray").exists()


def test_a_type_no_node_carries_is_refused_naming_the_types(ray_cluster):
    cluster = ClusterSpec(
        workers=[WorkerSpec(name="big", instance_type="p4d.24xlarge")], launcher="ray"
    )
    with pytest.raises(ConfigError, match=r"workers\[big\]\.instance_type: no node .* carries "):
        label_selectors(cluster, ray.nodes())
    try:
        label_selectors(cluster, ray.nodes())
    except ConfigError as e:
        assert all(t in str(e) for t in TYPES)


def test_the_cli_refuses_a_type_no_node_carries_before_the_flow_starts(ray_cluster, tmp_path):
    """`hetflow demo` asks the Ray cluster's node labels before its flow starts: one line
    naming the worker and the types the cluster has, no traceback, no Prefect server."""
    import os

    from tests.procs import run_cli

    cluster = tmp_path / "ray.yaml"
    cluster.write_text(
        "launcher: ray\nworkers:\n"
        "  - {name: t4, instance_type: g4dn.xlarge}\n  - {name: big, instance_type: p4d.24xlarge}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PREFECT_API"))}
    env.update(HETFLOW_HOME=str(tmp_path / "home"), PREFECT_HOME=str(tmp_path / "prefect"))
    args = ["demo", "--cluster", str(cluster), "--ray-address", ray_cluster.address]
    proc = run_cli(args, env, timeout=120)
    out = proc.stdout + proc.stderr
    errors = [line for line in out.splitlines() if "hetflow: error:" in line]
    assert proc.returncode == 2 and len(errors) == 1, out
    assert "workers[big].instance_type: no node of the Ray cluster carries" in errors[0]
    assert all(t in errors[0] for t in TYPES)
    assert "Traceback" not in out and "temporary server" not in out, out


def test_a_dead_address_is_one_line():
    from hetflow.infra.s3 import free_port

    with pytest.raises(ConfigError, match=r"^cluster\.ray_address: no Ray cluster answers at"):
        connect(f"127.0.0.1:{free_port()}")


def test_workers_typed_and_untyped_cannot_be_placed():
    with pytest.raises(ValueError, match=r"workers\[b\]\.instance_type: under the ray launcher"):
        ClusterSpec(
            workers=[WorkerSpec(name="a", instance_type="g5.xlarge"), WorkerSpec(name="b")],
            launcher="ray",
        )


def test_the_cli_refuses_a_dead_ray_address_in_one_line(capsys, hetflow_home):
    from hetflow.cli import main
    from hetflow.infra.s3 import free_port

    address = f"127.0.0.1:{free_port()}"
    assert main(["demo", "--launcher", "ray", "--ray-address", address]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hetflow: error: no Ray cluster answers at") and "ray_address" in err
    assert len(err.splitlines()) == 1
    assert not (hetflow_home / "runs").exists()


def test_a_killed_node_is_survived_from_s3_and_every_node_reports_metrics(
    ray_cluster, digits, tmp_path
):
    """The node of rank 1 dies after the first checkpoint; the cluster gets a node of the same
    type (as an autoscaler would), Ray Train restarts the group, and the run resumes from the
    checkpoint in S3: one restart, the steps since it redone (that resuming is exact is
    test_recovery's and test_rank_faults' claim, the same code under torchrun); and every
    node's system metrics are in the run."""

    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("nodes")).info.run_id
    spec = _spec(digits, tmp_path, "killed", "ray", ray_cluster.address)
    spec.train.steps, spec.train.lr = 30, 0.02
    spec.cluster.time_scale = 64  # steps slow enough to kill a node mid-run
    spec = spec.model_copy(update={"metrics_run": (uri, run_id)})  # each node samples itself
    runner, out = _run_past_step_5(spec)
    victim = next(
        n for n in ray_cluster.worker_nodes if n.node_labels.get(NODE_LABEL) == "g4dn.xlarge"
    )
    ray_cluster.remove_node(victim)
    ray_cluster.add_node(num_cpus=1, labels={NODE_LABEL: "g4dn.xlarge"})
    runner.join(timeout=280)
    result = RunResult.model_validate(out["r"][0])
    lead = result.lead
    assert lead.recovery.restarts == 1 and lead.recovery.steps_redone >= 2
    assert [r.step for r in lead.records][-1] == 29
    # every node the ranks ran on reported its system metrics into the run
    keys = client.get_run(run_id).data.metrics
    reported = {k.split("/")[1] for k in keys if k.endswith("/cpu_utilization_percentage")}
    assert {r.node for r in result.ranks} <= reported and len(reported) >= 3


@pytest.mark.parametrize("strategy", ["fsdp"])  # ddp's smaller state: the same path, locally
def test_a_node_lost_with_no_replacement_the_run_goes_on_with_the_workers_left(
    ray_cluster, digits, tmp_path, monkeypatch, strategy
):
    """The node of rank 1 (t4, g4dn.xlarge) dies after the first checkpoint and no node of its
    type comes back: Ray Train's placing of the restarted group times out (its start timeout
    cut to 5 s here, 3 tries), and the run goes on with v100 and a10g from the checkpoint in
    S3, the global batch shared by the two: every step done once in the records, the steps
    since the checkpoint redone, and t4 recorded as left out with why. The node comes back at
    the end for the module's other tests. Under fsdp the 3 ranks' shards in S3 (DCP) are
    read back re-sharded onto 2."""

    from hetflow.training.metrics import summarize

    monkeypatch.setenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "5")  # Ray hands it on
    # a run of its own per strategy: its checkpoints in S3 are found by the run's name
    spec = _spec(digits, tmp_path, f"shrunk-{strategy}", "ray", ray_cluster.address)
    spec.train.steps, spec.train.lr, spec.train.strategy = 30, 0.02, strategy
    spec.cluster.time_scale = 64  # steps slow enough to kill a node mid-run
    runner, out = _run_past_step_5(spec)
    victim = next(
        n for n in ray_cluster.worker_nodes if n.node_labels.get(NODE_LABEL) == "g4dn.xlarge"
    )
    try:
        ray_cluster.remove_node(victim)
        runner.join(timeout=280)
    finally:
        ray_cluster.add_node(num_cpus=1, labels={NODE_LABEL: "g4dn.xlarge"})
        ray_cluster.wait_for_nodes()
    result = RunResult.model_validate(out["r"][0])
    lead = result.lead
    assert list(lead.recovery.left_out) == ["t4"]
    assert "no replacement" in lead.recovery.left_out["t4"]
    labels = {n["NodeID"]: n["Labels"].get(NODE_LABEL) for n in ray.nodes()}
    assert [labels[r.node] for r in result.ranks] == ["p3.2xlarge", "g5.xlarge"]
    # the plan from the checkpoint on: two ranks, the global batch kept
    resumed = lead.recovery.resumed_at
    assert lead.plans[-1].step == resumed and resumed % spec.train.checkpoint_every == 0
    assert len(lead.plans[-1].plan) == 2 and sum(lead.plans[-1].plan) == spec.train.global_batch
    for r, batch in zip(result.ranks, lead.plans[-1].plan, strict=True):
        assert [x.step for x in r.records] == list(range(30))  # the checkpoint's, then on
        assert {x.batch for x in r.records[resumed:]} == {batch}
    assert lead.recovery.restarts == 1
    assert 0 <= lead.recovery.steps_redone <= spec.train.checkpoint_every
    assert summarize(result, spec.train.global_batch).workers_left_out == 1


def _run_past_step_5(spec: RunSpec):
    """`run_workers(spec)` started in a thread, once its progress has passed step 5 (or 120 s
    have gone): (the thread, the dict its result lands in as "r")."""
    import json
    import threading
    import time

    out: dict = {}
    runner = threading.Thread(target=lambda: out.update(r=run_workers(spec, timeout_s=250)))
    runner.start()
    progress = Path(spec.run_dir) / "progress.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if progress.exists() and json.loads(progress.read_text())["step"] >= 5:
            break
        time.sleep(0.1)
    return runner, out
