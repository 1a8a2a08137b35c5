"""The queue on the Ray launcher, on a real Ray cluster of two labelled nodes on this machine
(`ray.cluster_utils.Cluster`, started once for the module, as tests/integration/training/test_ray.py
does): the stop request travels through the cluster's own API (the named actor of
`training.loop.stop_channel`), never the run's file, and a moved job ends at the agreed
checkpoint and resumes there on its next workers."""

from __future__ import annotations

import json
import time

import pytest

from hetflow.config import ClusterSpec, DatasetSpec, TrackingConfig, WorkerSpec
from hetflow.config.queue import QueueJob
from hetflow.training.launch.ray_train import NODE_LABEL
from hetflow.training.loop.progress import STOP_FILE
from hetflow.training.loop.stop_channel import RayStopChannel

from tests.helpers.training.ray_cluster import labelled_cluster

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TYPES = ("g4dn.xlarge", "g5.xlarge")


@pytest.fixture(scope="module")
def ray_cluster(s3_server):
    """A 1-CPU head and one 1-CPU node per instance type, labelled; this process its driver."""
    yield from labelled_cluster(s3_server, TYPES)


def test_a_request_written_here_is_read_on_a_labelled_node(ray_cluster, tmp_path):
    """The queue's write reaches a process on another node; cleared, that process reads
    nothing; a run no request names reads nothing, and its first read does not hang."""

    @ray.remote(num_cpus=1, label_selector={NODE_LABEL: TYPES[1]})
    def read_there(key: str) -> tuple[int | None, str]:
        channel = RayStopChannel(key)
        return channel.read(), ray.get_runtime_context().get_node_id()

    writer = RayStopChannel("q-low")
    writer.clear()
    writer.write(8)
    step, node = ray.get(read_there.remote("q-low"))
    labels = {n["NodeID"]: n["Labels"].get(NODE_LABEL) for n in ray.nodes()}
    assert (step, labels[node]) == (8, TYPES[1])
    assert ray.get(read_there.remote("q-other"))[0] is None
    writer.clear()
    assert ray.get(read_there.remote("q-low"))[0] is None


def test_a_runs_progress_reported_on_a_labelled_node_is_read_here(ray_cluster):
    """Rank 0's progress, reported where it runs, is what the queue reads on its own host:
    none before the first report, the newest after, none once the run's entry is cleared."""

    @ray.remote(num_cpus=1, label_selector={NODE_LABEL: TYPES[0]})
    def report_there(key: str, steps: list[int]) -> None:
        channel = RayStopChannel(key)
        channel.read()  # finds the board, as rank 0's first read does
        for step in steps:
            channel.report(step)

    reader = RayStopChannel("q-progress")
    reader.clear()
    assert reader.progress() is None
    ray.get(report_there.remote("q-progress", [3, 4, 5]))
    deadline = time.monotonic() + 30  # the reports are sent without waiting for an answer
    while reader.progress() != 5 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert reader.progress() == 5
    reader.clear()
    assert reader.progress() is None


def test_a_high_job_moves_the_low_one_through_the_ray_channel(
    ray_cluster, s3, prefect_harness, hetflow_home, tmp_path
):
    from hetflow.flows.job_queue import queue

    workers = [
        WorkerSpec(name="t4", instance_type=TYPES[0], speed=1.0),
        WorkerSpec(name="a10g", instance_type=TYPES[1], speed=2.0),
    ]
    cluster = ClusterSpec(
        name="q-ray", workers=workers, time_scale=2.0, ray_address=ray_cluster.address
    )
    common = {"recipe": "digits-mlp", "global_batch": 32, "checkpoint_every": 4}
    jobs = [
        QueueJob(name="low", priority="low", steps=12, **common),
        QueueJob(name="high", priority="high", steps=4, arrive_after_s=1, **common),
    ]
    out = queue(
        jobs=jobs,
        cluster=cluster,
        dataset=DatasetSpec(url="s3://hetflow-queue-ray/digits", cache_dir=str(tmp_path / "c")),
        tracking=TrackingConfig(),
        switch_s=0.0,
        read_inbox=False,
        launcher="ray",
    )
    rows = {r["job"]: r for r in out["jobs"]}
    assert set(rows) == {"low", "high"}
    assert rows["low"]["segments"] >= 2  # stopped at its checkpoint, resumed
    assert out["figures"]["steps_redone"] == 0  # it ended at the checkpoint it resumed from
    spans = out["spans"]
    high_from = min(a for job, _, a, _ in spans if job == "high")
    low_until = max(b for job, _, _, b in spans if job == "low")
    assert high_from < low_until  # the high job ran before the low one had ended
    held = {}  # the low job's segments, by their start: the workers each held
    for job, worker, start, _ in spans:
        if job == "low":
            held.setdefault(start, set()).add(worker)
    # moved to other workers, so onto other labelled nodes (it may come back to its first
    # once the high job ends: a10g, t4, a10g)
    assert len({frozenset(w) for w in held.values()}) >= 2, held
    # it ended at the checkpoint agreed, and its next segment resumed there
    (recovery,) = (hetflow_home / "runs").glob("*-low/recovery.json")
    resumed = json.loads(recovery.read_text())
    assert resumed["resumed_at"] in (4, 8) and resumed["steps_redone"] == 0, resumed
    # the request went through the Ray channel: no run directory holds the file
    assert not list((hetflow_home / "runs").glob(f"*/{STOP_FILE}"))


def test_run_refuses_a_type_no_node_carries_before_the_session(
    ray_cluster, capsys, hetflow_home, monkeypatch, tmp_path
):
    import hetflow.flows.job_queue as flow
    from hetflow.cli import main

    monkeypatch.setattr(flow, "queue", lambda **kw: pytest.fail("the session started"))
    cluster = tmp_path / "ray.yaml"
    cluster.write_text(
        "workers:\n  - {name: t4, instance_type: g4dn.xlarge}\n"
        "  - {name: big, instance_type: p4d.24xlarge}\n"
    )
    assert main(["queue", "submit", "a"]) == 0
    capsys.readouterr()
    argv = ["--cluster", str(cluster), "--launcher", "ray", "--address", ray_cluster.address]
    assert main(["queue", "run", *argv]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(
        "hetflow: error: cluster.workers[big].instance_type: no node of the Ray cluster carries"
    )
    assert all(t in err[0] for t in TYPES)
