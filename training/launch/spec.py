"""The job file a torchrun worker reads: the config models plus what the flow decided."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from hetflow.config import ClusterSpec, DatasetSpec, TrainConfig
from hetflow.emulation.costs import SharedCosts
from hetflow.emulation.device_model import Straggler
from hetflow.emulation.emulator import Emulator
from hetflow.emulation.link import Link
from hetflow.infra.data.format import Manifest
from hetflow.records import Plan

_STARTED = time.time()  # this process's start, near enough (the module is imported early)


class Injection(BaseModel):
    """A fault injected for a test: at `step`, `rank`'s forward raises, returns NaN, or its
    process is killed (SIGKILL), stopped (SIGSTOP: a stalled worker) or sent SIGTERM; or, in
    the first join in place at or after `step` (`elastic.transfer`), the joiner `rank` is
    killed while it receives the state ('kill_receiving'), or the sender `rank` stops
    (SIGSTOP) while it sends it ('stop_sending')."""

    rank: int
    step: int
    kind: Literal["raise", "nan", "kill", "stop", "term", "kill_receiving", "stop_sending"]


class RunSpec(BaseModel):
    run_name: str
    variant: str
    mode: Literal["train", "profile"] = "train"
    cluster: ClusterSpec
    dataset: DatasetSpec
    train: TrainConfig
    plan: Plan | None = Field(None, description="What a training run starts with; none to profile.")
    stragglers: list[Straggler] = Field(
        default_factory=list,
        description="(rank, step, factor) or (rank, step, factor, ramp): from `step` on, that "
        "rank's slowdown is multiplied by factor, reached over `ramp` steps (0 or absent: at "
        "once; `device_model.straggler_factor`).",
    )
    inject: list[Injection] = Field(
        default_factory=list, description="Faults injected for tests (`training.faults`)."
    )
    backend: Literal["gloo", "nccl"] = Field(
        "gloo", description="The process group's (`training.devices.backend_for`), set at launch."
    )
    precisions: list[str] = Field(
        default_factory=list,
        description="Each rank's precision as the launcher resolved it (`check_devices`); a "
        "rank resolves its own again on its host. Empty: not yet resolved.",
    )
    manifest: Manifest | None = Field(
        None,
        description="The dataset's manifest, read and its shards listed once by the launcher "
        "(`run.stage_manifest`); none: each rank reads and lists them itself.",
    )
    run_dir: str
    state_url: str | None = Field(
        None,
        description="Where rank 0 also puts result.json and model.pt for a driver on another "
        "host (s3://, file://); none: the run directory alone.",
    )
    metrics_run: tuple[str, str] | None = Field(
        None,
        description="(tracking URI, run id): the MLflow run each node of a Ray cluster samples "
        "its system metrics into (`training.node_metrics`); none: the driver's alone.",
    )
    checkpoint_url: str | None = Field(
        None, description="Where checkpoints go; default RUN_DIR/checkpoints."
    )
    profile_batches: list[int] | None = Field(
        None,
        description="The batches the profile times each worker's step at; none: "
        "`default_profile_batches` of the global batch and the world.",
    )
    submitted_at: float | None = Field(
        None,
        description="time.time() when the run was handed to the launcher (`run_workers`): the "
        "ranks' timelines count from it.",
    )
    left_out: dict[str, str] = Field(
        default_factory=dict,
        description="Workers of the run the cluster goes on without, name -> why (a lost node "
        "with no replacement: `ray_launch`); the ranks record it in their `Recovery`.",
    )

    @model_validator(mode="after")
    def _plan_fits(self) -> RunSpec:
        if self.mode == "train" and self.plan is None:
            raise ValueError(
                "plan: a training run needs a plan (hetflow.training.plan.planner.make_plan)"
            )
        if self.plan is not None and len(self.plan.local_batches) != self.cluster.world_size:
            raise ValueError(
                f"plan.local_batches: {len(self.plan.local_batches)} batches for "
                f"{self.cluster.world_size} workers"
            )
        return self

    def write(self, path: Path) -> Path:
        path.write_text(self.model_dump_json(indent=1))
        return path

    @classmethod
    def read(cls, path: str | Path) -> RunSpec:
        return cls.model_validate_json(Path(path).read_text())


def since_submit(spec: RunSpec) -> float:
    """Seconds since `spec` was submitted (since this process started where it names no time:
    a job file written by hand)."""
    return time.time() - (spec.submitted_at or _STARTED)


def node_id() -> str:
    """The node this rank runs on: Ray's node id under the Ray launcher (`HETFLOW_NODE_ID`),
    else the host name."""
    return os.environ.get("HETFLOW_NODE_ID") or os.uname().nodename


def emulator_for(spec: RunSpec, rank: int, sync=None, scope: str = "train") -> Emulator:
    """The emulated device of `rank`: its slowdown, stragglers and link, or slowdown 1 and no
    link when not emulating (the stragglers still apply: tests slow a real rank with them).
    `sync` (`training.devices.synchronizer`: a CUDA rank's) times each compute phase to its end
    on the device, in wall time. On a CPU its phases' costs are shared with the job's other
    ranks on this host that compute the same thing (`SharedCosts` under the run directory, one
    table per `scope` and precision: the training, the profile, each compression trial)."""
    stragglers = {"stragglers": spec.stragglers, "rank": rank}  # emulated or not
    if not spec.cluster.emulate:
        return Emulator(1.0, Link(None, 0.0), sync=sync, **stragglers)
    w = spec.cluster.workers[rank]
    precision = spec.precisions[rank] if spec.precisions else spec.train.precision
    folder = Path(spec.run_dir) / "emulator" / f"{scope}-{precision}"
    world = spec.cluster.world_size
    return Emulator(
        spec.cluster.slowdowns()[rank],
        Link(w.link_gbps, w.link_latency_ms / 1e3, scale=spec.cluster.time_scale),
        noise=spec.cluster.step_noise(),
        shape=w.shape,
        seed=spec.train.seed * 1009 + rank,
        sync=sync,
        costs=SharedCosts(folder, rank, world),  # none kept on a GPU (`Emulator`)
        **stragglers,
    )


def default_profile_batches(global_batch: int, world: int) -> list[int]:
    """The powers of two a profile times a step at: from the largest at most a quarter of an
    equal share (global_batch / (4 x world), at least 1; an eighth of the top one at most) to
    the largest at most the global batch and 64. The planner extrapolates a worker's step
    below the smallest of them, and trusts it less there (`balance.exclude_slow`), so they
    reach down to the shares a slow worker gets; above 64 a step is as affine as at 64 and
    costs the probe more (pure).

    >>> default_profile_batches(128, 4), default_profile_batches(32, 4)
    ([8, 16, 32, 64], [2, 4, 8, 16, 32])
    >>> default_profile_batches(4, 8), default_profile_batches(1024, 2)
    ([1, 2, 4], [8, 16, 32, 64])
    """
    top = 1 << (max(1, min(64, global_batch)).bit_length() - 1)
    bottom = 1 << (max(1, global_batch // (4 * world)).bit_length() - 1)
    bottom = max(1, min(bottom, top // 8))  # four sizes at least, where the batch allows
    return [1 << k for k in range(bottom.bit_length() - 1, top.bit_length())]
