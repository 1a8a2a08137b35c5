"""Benchmarks that compare variants in one invocation: `hetflow bench NAME`.

Their shared helpers live in the installed package (`hetflow simulate --calibrate` uses them
too); they are imported here so that the benchmarks read `from benchmarks import ...`.
`profile_cluster` is the one helper of their own: the profile run the benchmarks plan from.
"""

from __future__ import annotations

from hetflow.config import ClusterSpec, DatasetSpec, TrainConfig
from hetflow.infra.workspace import digits_workspace
from hetflow.output import wide_console, write_json
from hetflow.records import Profile
from hetflow.training.job import RunSpec
from hetflow.training.launch import run_workers

__all__ = ["digits_workspace", "profile_cluster", "wide_console", "write_json"]


def profile_cluster(
    run_name: str, cluster: ClusterSpec, train: TrainConfig, dataset: DatasetSpec, run_dir: str
) -> Profile:
    """The cluster as its own workers measure it (a profile-mode run of `train`'s model on
    `dataset`, logs and result under `run_dir`), its time as the profile's `profiling_time_s`."""
    measured, wall = run_workers(
        RunSpec(
            run_name=run_name,
            variant="profile",
            mode="profile",
            cluster=cluster,
            dataset=dataset,
            train=train,
            run_dir=run_dir,
        )
    )
    return Profile.from_result(measured, cluster, train.model, profiling_time_s=wall)
