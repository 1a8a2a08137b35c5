"""Typed records that cross the layers, defined once: what a profile measured, what a plan
decided, what a run produced (the compression method as a parsed value: `hetflow.methods`).

They are pydantic models, so they travel as JSON (the workers' `result.json`, MLflow
artifacts, S3) and back without a dict with string keys in between:

    >>> Plan.equal([32, 32], why="baseline").compression.name
    'none'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hetflow.figures import RunMetrics, StepFigures

if TYPE_CHECKING:
    from hetflow.config.cluster import ClusterSpec

from hetflow.methods import (  # noqa: F401 (re-exported: callers import from hetflow.records)
    LOCAL_SGD,
    METHOD_NAMES,
    METHOD_SYNTAX,
    CompressionMethod,
    MethodName,
)


class _Record(BaseModel):
    # NaN and inf (a diverged loss) travel as JSON's NaN/Infinity, as json.dumps writes them.
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")


# -- profile ----------------------------------------------------------------------------------


class RankProfile(_Record):
    """One worker as measured inside its cluster (`hetflow.training.probes`).

    Compute: the step through DDP at a few batch sizes, fitted as `fit_latency_s +
    fit_s_per_sample x batch`; `samples_per_s` and `step_compute_s` at the reference batch
    (global batch / workers). Memory: the largest local batch that fits. All-reduce and link:
    fits of latency + bytes / bandwidth. S3: first-byte time and read throughput.
    """

    rank: int
    node: str = ""
    worker: str = Field("", description="The cluster's name for this worker (set by the flow).")
    relative_speed: float = Field(0.0, description="samples_per_s over the fastest worker's.")
    samples_per_s: float
    step_compute_s: float
    fit_latency_s: float
    fit_s_per_sample: float
    compute_rounds: int = 0
    compute_batches: list[int] = []
    compute_best_s: list[float] = []
    compute_outlier_batch: int | None = None
    memory_per_sample_bytes: float | None = None
    memory_fixed_bytes: float | None = None
    memory_available_bytes: int | None = None
    memory_cap_batch: int | None = None
    device: str = Field("", description="'cpu' or 'cuda' (the memory cap's model or search).")
    matmul_gflops: float | None = None
    memory_gbps: float | None = None
    allreduce_latency_s: float = 0.0
    allreduce_gbps: float | None = None
    grad_allreduce_s: float = 0.0
    allreduce_bytes: list[int] = []
    allreduce_median_s: list[float] = []
    link_gbps: float | None = None
    link_latency_s: float | None = None
    link_bytes: list[int] = []
    link_best_s: list[float] = []
    grad_bytes: int = 0
    s3_first_byte_s: float | None = None
    s3_read_mbps: float | None = None
    s3_bytes_probed: int = 0
    probe_s: dict[str, float] = Field({}, description="Wall seconds each probe took.")

    def step_model(self) -> tuple[float, float]:
        """(a, c) of this worker's compute time a + c x batch; c falls back to the measured
        pace where the fit's slope is not positive."""
        per_sample = self.fit_s_per_sample if self.fit_s_per_sample > 0 else 1 / self.samples_per_s
        return max(0.0, self.fit_latency_s), per_sample


class SpeedDrift(_Record):
    """A worker whose relative speed moved beyond the threshold since the previous profile."""

    worker: str
    previous_speed: float
    speed: float
    change: float
    previous_profile: str | None = None


class Profile(_Record):
    """Every worker of a cluster, measured for one model; what the planner plans from."""

    cluster: str
    model: str
    ranks: list[RankProfile] = Field(description="In rank order (sorted on validation).")
    profiling_time_s: float = 0.0
    created_at: str | None = None
    stored_at: str | None = None
    mlflow_run_id: str | None = None
    previous_profiles: list[str | None] = []
    drift: list[SpeedDrift] = []
    cost: dict | None = None
    cluster_spec: dict | None = Field(
        None, description="The ClusterSpec as profiled (instance types resolved), as JSON."
    )
    sources: list[str] = Field(
        [], description="Per rank: 'measured now', or the history entry reused (`hetflow.history`)."
    )
    prior: bool = Field(
        False,
        description="A prior, not a measurement in this cluster (`training.plan.prior`): the "
        "run's first plan, which it re-plans from its own steps.",
    )

    @field_validator("ranks")
    @classmethod
    def _in_rank_order(cls, ranks: list[RankProfile]) -> list[RankProfile]:
        return sorted(ranks, key=lambda r: r.rank)

    @classmethod
    def from_result(
        cls, result: dict, cluster: ClusterSpec, model: str, profiling_time_s: float = 0.0
    ) -> Profile:
        """The profile of a profile-mode run's `result.json` (`{"mode": "profile", "ranks"}`):
        ranks in rank order, named after `cluster`'s workers, speeds relative to the fastest's."""
        ranks = sorted(map(RankProfile.model_validate, result["ranks"]), key=lambda r: r.rank)
        fastest = max(r.samples_per_s for r in ranks)
        for r, w in zip(ranks, cluster.workers, strict=True):
            r.worker = w.name
            r.relative_speed = r.samples_per_s / fastest
        return cls(
            cluster=cluster.name, model=model, ranks=ranks, profiling_time_s=profiling_time_s
        )

    def step_models(self) -> tuple[list[float], list[float]]:
        """Per rank (a_i, c_i) of compute time = a_i + c_i x batch."""
        pairs = [r.step_model() for r in self.ranks]
        return [a for a, _ in pairs], [c for _, c in pairs]

    def comm_share(self) -> float:
        """Measured all-reduce time of one gradient over (compute + all-reduce) of one step."""
        comm = max(r.grad_allreduce_s for r in self.ranks)
        compute = max(r.step_compute_s for r in self.ranks)
        return comm / (comm + compute) if comm + compute > 0 else 0.0


# -- plan -------------------------------------------------------------------------------------


class Plan(_Record):
    """What a variant runs with: each worker's local batch and the gradient communication.
    `latency_s` and `per_sample_s` are the step model it was balanced with (empty when no
    profile was used); the re-balancer starts from them. `compression_candidates` ('auto'): the
    workers try each at the start of the run and keep the fastest (`CompressionTrials`), after
    a probe of an uncompressed first one where `compression_probe` (`Trials.not_worth_trying`).
    `micro_batch`, `micro_count`: the plan's micro-batches at the start (a re-plan splits its
    shares by the same caps)."""

    local_batches: list[int]
    compression: CompressionMethod = CompressionMethod()
    compression_reason: str = ""
    compression_candidates: list[CompressionMethod] = []
    compression_probe: bool = True  # 'auto': probe an uncompressed first candidate before trials
    speeds: list[float] = []
    latency_s: list[float] = []
    per_sample_s: list[float] = []
    caps: list[int | None] = []  # each worker's largest local batch (`planner.memory_caps`)
    excluded: list[str] = []  # workers left out of the synchronous step (batch 0), each with why
    dropped: list[str] = []  # of those, the workers not launched (`planner.drop_from_launch`)
    # `train.accumulate: auto`: each worker's largest micro-batch and how many it runs per step
    # (`balance.micro_split` of its share under its cap; 0 at batch 0); empty: one pass each.
    # The counts may differ between ranks: DDP makes one all-reduce per step whatever they are,
    # fsdp one all-gather and one reduce-scatter per unit (`training.loop.sharded.gathered`).
    micro_batch: list[int] = []
    micro_count: list[int] = []

    @classmethod
    def equal(cls, local_batches: list[int], why: str = "") -> Plan:
        """A plan with no profile behind it: these batches, plain all-reduce."""
        return cls(local_batches=list(local_batches), compression_reason=why)


class MethodTrial(_Record):
    """A candidate of 'auto' as tried (`training.trials`): `step_s`, its mean timed step on the
    slowest rank (None: it failed, `error` says why), and the bytes a rank sent per step."""

    method: CompressionMethod
    step_s: float | None = None
    spread_s: float = Field(0.0, description="Its timed steps' standard deviation (slowest rank).")
    bytes_per_step: float = 0.0
    error: str = ""


class CompressionTrials(_Record):
    """What 'auto' tried (in order, `steps` timed steps each), kept on every rank, and why."""

    trials: list[MethodTrial]
    steps: int
    chosen: CompressionMethod
    reason: str


# -- run result -------------------------------------------------------------------------------


class StepRecord(_Record):
    """One rank's step, in seconds: data wait, compute, and the wait after it, which splits
    into idle (for the slowest rank) and communication once every rank's time is known."""

    step: int
    batch: int
    data_s: float
    compute_s: float
    wait_s: float
    step_s: float
    loss_sum: float
    bytes_sent: float
    count: int | None = Field(
        None, description="What loss_sum sums over (samples, or tokens); None: the batch."
    )
    idle_s: float = 0.0
    comm_s: float = 0.0
    s3_bytes: int = 0  # fetched from S3 by this rank's cache since its previous step
    skipped: bool = Field(False, description="The gradient was not finite: no optimizer step.")
    micro_batches: int = Field(
        1, description="The micro-batches the batch ran as, one backward each (train.accumulate)."
    )
    inner_steps: int = Field(
        0, description="Strategy 'diloco': the inner steps this rank took in the round."
    )


class PlanChange(_Record):
    """The local batches in force from `step` on."""

    step: int
    plan: list[int]


class EvalPoint(_Record):
    """What the recipe's `evaluate` returned after `step` steps: accuracy (classifiers) or
    val_loss and perplexity (language models); other figures it returns are in `more`."""

    step: int
    train_time_s: float
    wall_s: float | None = Field(None, description="Seconds since the run was submitted.")
    accuracy: float | None = None
    val_loss: float | None = None
    perplexity: float | None = None
    more: dict[str, float] = {}

    @model_validator(mode="after")
    def _headline(self) -> EvalPoint:
        if self.accuracy is None and self.val_loss is None:
            raise ValueError("a recipe's evaluate must return 'accuracy' or 'val_loss'")
        return self

    @classmethod
    def of(
        cls, step: int, train_time_s: float, figures: dict[str, float], wall_s: float | None = None
    ) -> EvalPoint:
        """The point of `figures` (a recipe's `evaluate`), its named figures as fields."""
        named = {k: v for k, v in figures.items() if k in ("accuracy", "val_loss", "perplexity")}
        more = {k: v for k, v in figures.items() if k not in named}
        return cls(step=step, train_time_s=train_time_s, wall_s=wall_s, **named, more=more)

    def figures(self) -> dict[str, float]:
        """Every figure of the point by name, e.g. {'accuracy': 0.9}."""
        named = {k: getattr(self, k) for k in ("accuracy", "val_loss", "perplexity")}
        return {**{k: v for k, v in named.items() if v is not None}, **self.more}


class CacheCounts(_Record):
    hits: int = 0
    misses: int = 0
    bytes_read: int = 0


class MembershipChange(_Record):
    """The ranks of a running job regrouped in place (`faults.on_loss: continue`): at `step`
    (the step they went on from), `lost` left, `world` ranks stayed; `step_in_flight`: what
    became of the step the loss interrupted, 'retried' (no rank applied it; the survivors ran
    it again) or 'none' (it was done on every rank before the loss); `regroup_s`: from the
    failure this rank saw to its new group; `plan`: the shares from `step` on; `joined`: the
    ranks admitted into it (a worker that joined in place); `join_s`: on a rank that joined or
    sent it the state, the join's seconds by phase (`elastic.transfer`); `workers`: the worker
    each rank of it runs as, rank -> name (the launcher's record: empty where it kept none)."""

    step: int
    lost: list[int]
    world: int
    step_in_flight: Literal["retried", "none"]
    regroup_s: float
    plan: list[int]
    joined: list[int] = []
    join_s: dict[str, float] = {}
    workers: dict[int, str] = {}


class Recovery(_Record):
    """Restarts of this run (torchrun's, Ray Train's, a retried task's), the steps done again,
    `left_out`: the workers it went on without, name -> why (`training.ray_launch`), and
    `membership`: the regroups in place of a job that went on without lost workers, and
    `replica_digest`: a digest of the rank's final weights there, which every rank left shares."""

    restarts: int = 0
    steps_redone: int = 0
    resumed_at: int | None = None
    left_out: dict[str, str] = {}
    membership: list[MembershipChange] = []
    replica_digest: str | None = None


class StartupPhases(_Record):
    """A rank's start-up by phase, in seconds, one after another from the run's submit
    (`training.launch.startup` says where each ends): the launcher's spawn of its process,
    the imports, the rendezvous, the data, the model (the training loop built, 'auto''s
    trials not counted) and the first step's warm-up; with `Timeline.trials_s` they add up
    to its `first_step_s`. All 0: not recorded (the Ray launcher marks none yet)."""

    spawn_s: float = 0.0
    import_s: float = 0.0
    rendezvous_s: float = 0.0
    data_s: float = 0.0
    model_s: float = 0.0
    first_step_s: float = 0.0


class Timeline(_Record):
    """A rank's wall clock through its run, in seconds since the run was submitted
    (`RunSpec.submitted_at`): when its first step began, when the steps that throughput counts
    began (after the warm-up), when its loop ended, and what the loop spent in 'auto''s
    trials, evaluations and checkpoints, and its `startup` by phase; `first_step` is the step
    its loop began at (past 0 on a resumed run). All 0: not recorded."""

    first_step: int = 0
    first_step_s: float = 0.0
    steady_from_s: float = 0.0
    loop_end_s: float = 0.0
    trials_s: float = 0.0
    eval_s: float = 0.0
    checkpoint_s: float = 0.0
    startup: StartupPhases = StartupPhases()


class RankResult(_Record):
    """What one rank of a training run returns: one process, from the step it began at to
    the step it ended, left (`RunResult.departed`) or was lost at (`RunResult.lost`), as the
    cluster's worker `worker`."""

    rank: int
    node: str = ""
    worker: str = Field(
        "",
        description="The worker this rank's process ran as: its launch slot's, or the one "
        "added into that slot in place (`elastic.launch.ElasticJob.add_worker`); '': not "
        "recorded (`worker_index`: its slot's).",
    )
    records: list[StepRecord]
    plans: list[PlanChange]
    evals: list[EvalPoint] = Field([], description="Rank 0's only; empty elsewhere.")
    replans: list[dict] = Field([], description="The re-balancer's log (Rebalancer.history).")
    bytes_total: float = 0.0
    control_bytes: float = 0.0
    params: int = 0
    load_s: float = 0.0
    recovery: Recovery = Recovery()
    bookkeeping_s: float = 0.0
    cache: CacheCounts = CacheCounts()
    peak_rss_bytes: int = Field(0, description="The rank process's peak resident memory.")
    start_rss_bytes: int = Field(0, description="That peak before it opened the data.")
    state_bytes: int = Field(
        0,
        description="Bytes of parameters, gradients and optimizer state the rank holds (its "
        "shards under fsdp; gradients counted as large as the parameters).",
    )
    peak_device_bytes: int = Field(
        0, description="Peak memory allocated on its GPU; on a CPU, its peak resident memory."
    )
    trials: CompressionTrials | None = Field(None, description="'auto''s choice; else none.")
    cores: list[int] = Field([], description="The CPU cores the rank's process could run on.")
    cpu_quota: float | None = Field(
        None, description="The CPU quota, in cores, of the cgroup the rank ran in (the kernel's)."
    )
    timeline: Timeline = Timeline()

    def worker_index(self, cluster: ClusterSpec) -> int:
        """The index in `cluster` (the launched one) of the worker this rank ran as, by its
        name; its slot (`rank`) where it names none or one outside `cluster` (a worker added
        in place under a name of its own runs as its slot's worker)."""
        names = [w.name for w in cluster.workers]
        return names.index(self.worker) if self.worker in names else self.rank


class RunResult(_Record):
    """Every rank's result of one training run, in rank order (the workers' result.json): the
    ranks in the job at its end; `departed`, those that left it in place before (under
    `faults.on_loss: continue`), each with the steps it ran; `lost`, those lost (killed,
    stalled) there, each as the survivors rebuilt it from the step times shared with them
    (`training.elastic.lost`: batch, compute and idle time measured; the rest 0)."""

    mode: Literal["train"] = "train"
    ranks: list[RankResult]
    departed: list[RankResult] = Field([], description="Ranks that left in place, in order.")
    lost: list[RankResult] = Field([], description="Ranks lost in place, in order.")

    @property
    def stretches(self) -> list[RankResult]:
        """Every process's result: the ranks at the end, then those that left, then those
        lost."""
        return [*self.ranks, *self.departed, *self.lost]

    @property
    def lead(self) -> RankResult:
        """The rank that wrote the result, first in `ranks`: rank 0, which holds the
        evaluations and the plan history (under `on_loss: continue`, where rank 0 was lost,
        the rank that took its part, though a worker that joined later holds rank 0)."""
        return self.ranks[0]


# -- train outcome ----------------------------------------------------------------------------


class TrainOutcome(_Record):
    """One trained variant, as the train task hands it to the tracker and the flows.

    `metrics` are the run's figures (`summarize`, then launch time and cost) and `series` one
    record per step (`step_series`), each worker numbered as in the cluster.
    Flows return JSON: `model_dump(mode="json")` of it, or of fields of it."""

    variant: str = Field(description="The run's label: MLflow run name and `variant` tag.")
    run_id: str = Field(description="The MLflow run.")
    run_dir: str
    plan: Plan = Field(description="The plan the run started with.")
    metrics: RunMetrics
    series: list[StepFigures] = []
    result: RunResult
