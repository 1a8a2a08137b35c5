"""Every node's system metrics in the run's MLflow run (the Ray launcher's nodes).

The driver samples its own host (`MLflowTracker.system_metrics`); under Ray the ranks run on
other nodes, so one rank of each node (the first to claim it, by a file created exclusively in
the node's temporary folder) runs MLflow's own
`SystemMetricsMonitor` there: CPU, memory, disk, network, and GPU utilization and memory where
`nvidia-ml-py` and a GPU are present, logged as `system/NODE/...` with the node's id
(`job.node_id`: Ray's node id). Written with MLflow's system-metrics API, nothing of our own.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from hetflow.training.launch.spec import RunSpec, node_id

SAMPLING_INTERVAL_S = 2.0


def _claim(path: Path) -> bool:
    """Whether this process created `path` (and so samples this node)."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


@contextlib.contextmanager
def node_metrics(spec: RunSpec) -> Iterator[None]:
    """This node's system metrics sampled into `spec.metrics_run` for the context, by one rank
    of each node of a job on the Ray launcher; nothing otherwise."""
    if spec.metrics_run is None or spec.cluster.launcher != "ray":
        yield
        return
    tracking_uri, run_id = spec.metrics_run
    claim = Path(tempfile.gettempdir()) / f"hetflow-metrics-{run_id}-{node_id()}"
    if not _claim(claim):
        yield
        return
    import mlflow.system_metrics
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    # MLflow's variable wins over the monitor's argument, and a node may have inherited the
    # driver's (its host name) when it started: this process names its own node
    mlflow.system_metrics.set_system_metrics_node_id(node_id())

    monitor = SystemMetricsMonitor(
        run_id,
        sampling_interval=SAMPLING_INTERVAL_S,
        samples_before_logging=1,
        node_id=node_id(),
        tracking_uri=tracking_uri,
    )
    monitor.start()
    try:
        yield
    finally:
        monitor.finish()
        _last_sample(monitor)
        claim.unlink(missing_ok=True)


def _last_sample(monitor) -> None:
    """One more sample of this node, logged once the monitor's thread has stopped: MLflow's
    monitor logs a sample only after a whole interval, so a rank whose work ends sooner would
    leave its node unreported. A metrics failure never fails the rank."""
    try:
        monitor.collect_metrics()
        monitor.publish_metrics(monitor.aggregate_metrics())
        monitor.mlflow_logger.flush()
    except Exception as e:  # a sample lost is a figure missing, not a failure
        print(f"node metrics: the last sample was not logged ({e})", flush=True)
