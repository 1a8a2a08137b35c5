"""The Ray launcher: every worker of the cluster spec becomes one Ray Train worker, placed by a
label selector on a node of its instance type, running the same rank code as under torchrun.

Ray Train (`TorchTrainer`) builds the process group across the nodes, gang-schedules the workers
and restarts the group on a failure (`FailureConfig`); hetflow writes no launcher or collective
of its own here. A node carries its instance type as the label `NODE_LABEL`
(`ray start --labels hetflow.io/instance-type=g5.xlarge`, or the `labels` of its node type in the
cluster launcher's YAML); a worker that names `instance_type` gets the selector
`{NODE_LABEL: instance_type}` (Ray 2.60's `ScalingConfig(label_selector=[...])`, one per worker,
in rank order).

A node lost mid-run with no node of its type to replace it: the run goes on without the
workers it held, the global batch shared by the others, from the last checkpoint
(`run_workers_ray`, `go_on_without`).

Run state: rank 0 writes `result.json` and `model.pt` to the run's state URL (`RunSpec.state_url`;
the dataset's S3 bucket under `runs/` by default), and checkpoints go beside them, so the driver
and a restarted rank on any node find them. Ray's workers do not inherit the driver's
environment: `worker_environment` hands them the S3 endpoint and hetflow's home, and the local
endpoint's fixed, non-secret credentials only; real credentials come from the nodes' own
environment or instance role, never through Ray.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

from hetflow.config import ClusterSpec, ConfigError, FaultPolicy
from hetflow.infra.preflight import ray_problem
from hetflow.infra.s3 import LOCAL_CREDENTIALS, filesystem
from hetflow.training.cpu_quota import JobCgroups, find_controller
from hetflow.training.launch.outcome import Launched, LaunchError
from hetflow.training.launch.spec import RunSpec
from hetflow.training.plan.balance import PlanError
from hetflow.training.plan.planner import replan_without
from hetflow.training.plan.ranks import RankMap
from hetflow.training.plan.rounds import resolve_rounds

NODE_LABEL = "hetflow.io/instance-type"


def ray_address(cluster: ClusterSpec) -> str:
    """The cluster spec's Ray address, else $RAY_ADDRESS, else 'auto'."""
    return cluster.ray_address or os.environ.get("RAY_ADDRESS") or "auto"


def connect(address: str) -> None:
    """Join the Ray cluster at `address` (once per process); a one-line ConfigError naming
    `cluster.ray_address` when none answers there."""
    import ray

    problem = ray_problem(address)
    if problem is not None:
        raise ConfigError(f"cluster.ray_address: {problem}")
    if ray.is_initialized():
        return
    try:
        ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    except ConnectionError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"cluster.ray_address: no Ray cluster at {address!r}: {first}") from None


def label_selectors(cluster: ClusterSpec, nodes: list[dict]) -> list[dict[str, str]] | None:
    """One selector per worker, in rank order, for the alive `nodes` (`ray.nodes()`); None when
    no worker names an instance type. A ConfigError naming the worker when no node carries its
    type, with the types the cluster has."""
    if not any(w.instance_type for w in cluster.workers):
        return None
    have = sorted({n.get("Labels", {}).get(NODE_LABEL) for n in nodes if n.get("Alive")} - {None})
    for w in cluster.workers:
        if w.instance_type not in have:
            listed = ", ".join(have) if have else f"no node labelled {NODE_LABEL}"
            raise ConfigError(
                f"cluster.workers[{w.name}].instance_type: no node of the Ray cluster carries "
                f"{w.instance_type!r}; it has: {listed}"
            )
    return [{NODE_LABEL: w.instance_type} for w in cluster.workers]


def worker_environment() -> dict[str, str]:
    """What Ray's workers need of the driver's environment: the S3 endpoint, hetflow's home,
    and the local endpoint's fixed credentials where those are the ones in use (never others)."""
    env = {k: os.environ[k] for k in ("AWS_ENDPOINT_URL", "HETFLOW_HOME") if k in os.environ}
    if all(os.environ.get(k) == v for k, v in LOCAL_CREDENTIALS.items()):
        env.update(LOCAL_CREDENTIALS)
    return env


def rank_main(config: dict) -> None:
    """A Ray Train worker: this rank of the job, in the process group Ray Train set up."""
    import ray
    import ray.train

    from hetflow.training.launch.node_metrics import node_metrics
    from hetflow.training.worker import place_rank, serve_rank

    spec = RunSpec.model_validate_json(config["spec"])
    ctx = ray.train.get_context()
    os.environ["HETFLOW_NODE_ID"] = ray.get_runtime_context().get_node_id()
    rank, local_rank = ctx.get_world_rank(), ctx.get_local_rank()
    device, precision = place_rank(spec, rank, local_rank)
    with node_metrics(spec):
        serve_rank(spec, rank, device, precision, "Ray Train")


def run_workers_ray(spec: RunSpec, timeout_s: float = 1800) -> Launched:
    """Run `spec` on the Ray cluster of its cluster spec to completion: its result and wall
    seconds. `spec` comes checked and placed by `run.run_workers`, its state in shared
    storage (`with_shared_state`). Placement is checked before anything is placed.

    A node lost mid-run: Ray Train restarts the group and it resumes from the last
    checkpoint, as the job's failure policy says (`train.faults`, `failure_config`): up to
    `group_restarts` times, and `placement_tries` tries, each for Ray's start timeout
    (`RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S`, 60 s by default), to place the restarted group.
    Where no alive node then has room for some workers (their node type has no replacement),
    the run goes on without them (`go_on_without`, where the policy allows it): the global
    batch shared by the others, from the last checkpoint, each left out recorded with why in
    the ranks' `Recovery.left_out`. Each launch after one gives Ray Train its restarts anew;
    there are at most one per worker, and one more. A LaunchError: of one line when no worker
    is left or the policy does not go on without them; with Ray Train's error where it fails
    otherwise.
    """
    import ray

    connect(ray_address(spec.cluster))
    label_selectors(spec.cluster, ray.nodes())  # a one-line error before anything is placed
    run_dir = Path(spec.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    # ranks on this host find their cgroup made; on another host they make it (`join_quota`)
    cgroups = JobCgroups.of(spec.cluster, spec.run_name, find_controller())
    with cgroups or contextlib.nullcontext():
        spec = _place_and_fit(spec)
    wall = time.perf_counter() - t
    return Launched(_read_result(spec, run_dir), wall)


def _place_and_fit(spec: RunSpec) -> RunSpec:
    """`_fit` until the group is placed, going on without the workers that no node has room
    for where the policy allows it (see `run_workers_ray`); the spec the job finished as."""
    import ray

    for attempt in range(spec.cluster.world_size + 1):
        try:
            _fit(spec, attempt)
            break
        except Exception as e:
            if not _unplaced(e):
                raise LaunchError(f"Ray Train: {e}") from e
            lost = unplaceable(spec.cluster, ray.nodes(), spec.backend == "nccl")
            if not lost:
                print(f"{spec.run_name}: placing timed out, yet each worker has room now: again")
                continue
            if not spec.train.faults.go_on_without:
                raise LaunchError(
                    f"Ray Train: no node has room for {', '.join(lost)} and "
                    "train.faults.go_on_without is off"
                ) from None
            try:
                spec = go_on_without(spec, lost)
            except PlanError as e:
                raise LaunchError(f"Ray Train: {e}") from None
    else:
        raise LaunchError(f"Ray Train: the workers of {spec.run_name} could not be placed")
    return spec


def failure_config(policy: FaultPolicy):
    """Ray Train's `FailureConfig` as the failure policy says: the group restarted up to
    `group_restarts` times, a restarted group's placement tried `placement_tries` times."""
    from ray.train import FailureConfig

    return FailureConfig(
        max_failures=policy.group_restarts,
        controller_failure_limit=max(0, policy.placement_tries - 1),
    )


def _fit(spec: RunSpec, attempt: int) -> None:
    """One Ray Train run of `spec` (its `attempt`-th launch) to its end; Ray's
    TrainingFailedError as it raises it. The job file is written first."""
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    spec.write(Path(spec.run_dir) / "job.json")
    trainer = TorchTrainer(
        rank_main,
        train_loop_config={"spec": spec.model_dump_json()},
        torch_config=TorchConfig(backend=spec.backend, timeout_s=int(spec.train.stall_timeout_s)),
        scaling_config=ScalingConfig(
            num_workers=spec.cluster.world_size,
            use_gpu=spec.backend == "nccl",
            resources_per_worker={"CPU": 1},
            label_selector=label_selectors(spec.cluster, ray.nodes()),
        ),
        run_config=RunConfig(
            name=spec.run_name if attempt == 0 else f"{spec.run_name}-{attempt}",
            storage_path=str(Path(spec.run_dir) / "ray"),
            failure_config=failure_config(spec.train.faults),
            worker_runtime_env={"env_vars": worker_environment()},
        ),
    )
    trainer.fit()


def _unplaced(e: Exception) -> bool:
    """Whether Ray Train gave up placing the worker group (its start timed out, every try)."""
    failure = getattr(e, "controller_failure", None)
    # ray.train.v2._internal.exceptions: by name, not through Ray's internal module
    return type(failure).__name__ == "WorkerGroupStartupTimeoutError"


def unplaceable(cluster: ClusterSpec, nodes: list[dict], use_gpu: bool) -> dict[str, str]:
    """The workers of `cluster` that no alive node of `nodes` (`ray.nodes()`) has room for,
    name -> why (pure): in rank order, each worker takes one CPU (and one GPU under `use_gpu`),
    as `run_workers_ray` asks, of a node of its instance type (of any node where no worker
    names one); those left without are returned. Other jobs' use of the nodes is not seen."""
    typed = any(w.instance_type for w in cluster.workers)
    room: dict[str | None, int] = {}
    for n in nodes:
        kind = n.get("Labels", {}).get(NODE_LABEL) if typed else None
        if not n.get("Alive") or (typed and kind is None):
            continue
        have = n.get("Resources", {})
        slots = (
            int(have.get("CPU", 0))
            if not use_gpu
            else int(min(have.get("CPU", 0), have.get("GPU", 0)))
        )
        room[kind] = room.get(kind, 0) + slots
    out = {}
    for w in cluster.workers:
        kind = w.instance_type if typed else None
        if room.get(kind, 0) > 0:
            room[kind] -= 1
        else:
            where = f"of {kind}" if kind else "of the cluster"
            out[w.name] = (
                f"no alive node {where} has room for it: its node was lost, no replacement came"
            )
    return out


def go_on_without(spec: RunSpec, lost: dict[str, str]) -> RunSpec:
    """`spec` as the run goes on without the workers `lost` names (name -> why): the global
    batch shared anew by the others (`planner.replan_without`), their ranks removed and the
    rest renumbered (`RankMap.launched`, stragglers too), their precisions and injected
    faults dropped, under diloco its rounds derived anew for them (`resolve_rounds`), and
    `left_out` naming them with why. The run resumes from the last
    checkpoint (`state.narrowed`). Said on stdout; a PlanError when none is left."""
    plan = replan_without(spec.cluster, spec.plan, lost, spec.train)
    ranks = RankMap(spec.cluster, plan)
    keep = ranks.workers
    cluster, sub_plan, stragglers = ranks.launched(spec.stragglers)
    renumber = {old: new for new, old in enumerate(keep)}
    print(
        f"{spec.run_name}: going on without {', '.join(lost)} ({'; '.join(lost.values())}): "
        f"{', '.join(w.name for w in cluster.workers)} at local batches "
        f"{sub_plan.local_batches} (global batch {spec.train.global_batch} kept), from the "
        "last checkpoint",
        flush=True,
    )
    return spec.model_copy(
        update={
            "cluster": cluster,
            "plan": sub_plan,
            "train": resolve_rounds(spec.train, sub_plan),  # a round of the workers left
            "stragglers": stragglers,
            "precisions": [spec.precisions[i] for i in keep] if spec.precisions else [],
            "inject": [
                j.model_copy(update={"rank": renumber[j.rank]})
                for j in spec.inject
                if j.rank in renumber
            ],
            "left_out": {**spec.left_out, **lost},
        }
    )


def _read_result(spec: RunSpec, run_dir: Path) -> dict:
    """result.json of the run, from its state URL where it has one (model.pt fetched too)."""
    if spec.state_url is None:
        return json.loads((run_dir / "result.json").read_text())
    fs, path = filesystem(f"{spec.state_url}/result.json")
    if not (run_dir / "model.pt").exists() and fs.exists(f"{path[: -len('result.json')]}model.pt"):
        fs.get_file(f"{path[: -len('result.json')]}model.pt", str(run_dir / "model.pt"))
    return json.loads(fs.cat_file(path))


def with_shared_state(spec: RunSpec) -> RunSpec:
    """`spec` with its state and checkpoints in the dataset's S3 bucket under runs/RUN_NAME
    (where the user set none), so that every node and the driver find them."""
    if spec.state_url or not spec.dataset.url.startswith("s3://"):
        return spec
    bucket = spec.dataset.url.removeprefix("s3://").split("/", 1)[0]
    state = f"s3://{bucket}/runs/{spec.run_name}"
    return spec.model_copy(
        update={"state_url": state, "checkpoint_url": spec.checkpoint_url or f"{state}/checkpoints"}
    )
