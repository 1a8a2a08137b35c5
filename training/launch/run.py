"""From a plan to a result: the one path the train task, the benchmarks and the calibration take.

    ran = run_plan(cluster, make_plan(profile, cluster, train), train, dataset, run_dir,
                   variant="optimized")
    ran.result, ran.wall_s, ran.ranks.to_cluster(figures)

The workers the plan drops are not launched; the others run as ranks renumbered in order
(`RankMap`). `run_workers` is the one launcher interface: it checks a job on this host, then
hands it to torchrun (`local.run_torchrun`) or Ray Train (`ray_train.run_workers_ray`) as the
cluster's `launcher` says; `measure_profile` is a profile-mode job through it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from hetflow.config import ClusterSpec, DatasetSpec, TrainConfig
from hetflow.infra.data.format import Manifest, check_shards, read_manifest
from hetflow.records import Plan, Profile, RunResult
from hetflow.training.cores import core_sets, host_cores
from hetflow.training.cpu_quota import check_quotas
from hetflow.training.devices import Placement, check_devices
from hetflow.training.elastic.launch import run_elastic
from hetflow.training.launch.agents import WARM_RANKS
from hetflow.training.launch.local import run_torchrun
from hetflow.training.launch.mps import check_mps, mps_available
from hetflow.training.launch.outcome import Launched
from hetflow.training.launch.ray_train import run_workers_ray, with_shared_state
from hetflow.training.launch.ready import launch_ready
from hetflow.training.launch.spec import RunSpec
from hetflow.training.plan.ranks import RankMap, Stragglers


def run_workers(
    spec: RunSpec, timeout_s: float = 1800, on_progress=None, placement: Placement | None = None
) -> Launched:
    """Run the job `spec` to completion under its cluster's launcher: (result.json, wall s).
    Each worker's device and precision are checked on this host first (`check_devices`), which
    also sets the backend: NCCL when every rank has a CUDA device of its own, else gloo;
    `placement`, where the caller has it (the resolved job's, of `spec.cluster`:
    `ResolvedJob.placement_of`), is taken as it is instead. Then the cores, CPU quotas and MPS
    shares the workers ask for. A one-line ConfigError before anything is written. Under
    `launcher: ray` the job runs on Ray Train, its state in the dataset's bucket; else under
    torchrun on this host. Either restarts the group as the job's failure policy says
    (`train.faults`); `on_progress`: `run_torchrun`'s. Raises the launchers' `LaunchError`
    (`RankFailed` when a rank raised). The ranks take `spec.train` as it is: it is resolved
    here where the caller did not (`launch_ready`)."""
    spec = launch_ready(spec)
    if placement is None:  # a one-line error before launch
        placement = check_devices(spec.cluster, spec.train)
    core_sets(spec.cluster, host_cores())  # the cores asked for exist here
    check_quotas(spec.cluster, len(host_cores()))  # the kernel enforces CPU quotas here
    check_mps(spec.cluster, *mps_available())  # MPS runs here, where a worker has a gpu_share
    spec = spec.model_copy(
        update={
            "backend": placement.backend,
            "precisions": placement.precisions,
            "submitted_at": spec.submitted_at or time.time(),
        }
    )
    if spec.train.faults.on_loss == "continue":  # regroups in place: its own launcher
        return run_elastic(spec, timeout_s, on_progress)
    if spec.cluster.launcher == "ray":
        return run_workers_ray(with_shared_state(spec), timeout_s)
    spec = spec.model_copy(update={"manifest": spec.manifest or stage_manifest(spec.dataset)})
    # every rank on the CPU: forked from a warm agent (a CUDA driver does not survive a fork)
    warm = WARM_RANKS and all(d == "cpu" for d in placement.devices)
    return run_torchrun(spec, timeout_s, on_progress, warm=warm)


def stage_manifest(dataset: DatasetSpec) -> Manifest | None:
    """The dataset's manifest, read and its shards listed here once (`read_manifest`,
    `check_shards`), for the job file: the ranks on this host then read and list nothing
    (`open_rank_data`), and make no S3 client where their shards are cached. None where it
    cannot be read: each rank then reads it and fails as before, naming what is wrong."""
    try:
        manifest = read_manifest(dataset.url)
        check_shards(manifest)
    except Exception:  # no store, no credentials, a bad manifest: a rank reports it
        return None
    return manifest


def measure_profile(
    cluster: ClusterSpec,
    dataset: DatasetSpec,
    train: TrainConfig,
    run_dir: str | Path,
    profile_batches: list[int] | None = None,
    placement: Placement | None = None,
) -> Profile:
    """Every worker of `cluster` measured inside it (a job with mode="profile", its files
    under `run_dir`, under the cluster's launcher): the `Profile` the planner and the
    simulator read. `profile_batches`: the batches each step is timed at (default:
    `default_profile_batches` of this cluster); `placement`: `run_workers`' own."""
    run_dir = Path(run_dir)
    spec = RunSpec(
        run_name=run_dir.name,
        variant="profile",
        mode="profile",
        cluster=cluster,
        dataset=dataset,
        train=train,
        run_dir=str(run_dir),
        profile_batches=profile_batches,
    )
    result, wall = run_workers(spec, placement=placement)
    return Profile.from_result(result, cluster, train.recipe, profiling_time_s=wall)


@dataclass(frozen=True)
class Ran:
    """A finished run: its result (`raw`, result.json as the ranks wrote it), its wall time
    with launch, and the map of the ranks it finished on to the cluster's workers."""

    result: RunResult
    wall_s: float
    ranks: RankMap
    raw: dict


def run_plan(
    cluster: ClusterSpec,
    plan: Plan,
    train: TrainConfig,
    dataset: DatasetSpec,
    run_dir: str | Path,
    *,
    variant: str,
    stragglers: Stragglers | None = None,
    metrics_run: tuple[str, str] | None = None,
    on_progress=None,
    timeout_s: float = 1800,
    placement: Placement | None = None,
) -> Ran:
    """Run `plan` (over every worker of `cluster`) to its result, its files under `run_dir`.

    `stragglers` (rank, step, factor[, ramp]) are numbered by the cluster's workers; `metrics_run`
    and `on_progress` are `RunSpec.metrics_run` and `run_workers`' own; `placement`, of
    `cluster` (`ResolvedJob.placement_of`), is used where the plan launches every worker (a
    launch of fewer places its ranks anew). Raises what
    `run_workers` raises (`LaunchError`, `RankFailed`, a ConfigError before launch). A job
    with spare workers (`faults.spare`) launches every worker the plan covers, none dropped."""
    if train.faults.spare:  # every slot launched: the started ones' shares are re-cut over
        plan = plan.model_copy(update={"dropped": []})  # them at the start (`elastic.loop`)
    ranks = RankMap(cluster, plan)
    launched, launched_plan, moved = ranks.launched(stragglers)
    run_dir = Path(run_dir)
    spec = RunSpec(
        run_name=run_dir.name,
        variant=variant,
        cluster=launched,
        dataset=dataset,
        train=train,
        plan=launched_plan,
        stragglers=moved,
        run_dir=str(run_dir),
        metrics_run=metrics_run,
    )
    placed = placement if launched.workers == cluster.workers else None
    raw, wall = run_workers(spec, timeout_s=timeout_s, on_progress=on_progress, placement=placed)
    result = RunResult.model_validate(raw)
    return Ran(result, wall, ranks.finished(result), raw)
