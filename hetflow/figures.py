"""A run's figures as records with fields: `RunMetrics` (the run, and each cluster worker's
`RankFigures`) and `StepFigures` (one step). `training.metrics` fills them from a `RunResult`;
the train task adds launch time, end-to-end time and cost; `flat` names them for MLflow, the
terminal table and the benchmarks' JSON, in this one place (docs/metrics.md lists the names).

    >>> m = RunMetrics(throughput_samples_per_s=900.0, steps=3,
    ...     ranks=[RankFigures(rank=0, local_batch=32, busy_fraction=0.5)])
    >>> m.flat()["rank0/local_batch"], "final_accuracy" in m.flat()
    (32, False)
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

Figures = dict[str, int | float]  # MLflow name -> value (counts stay int)


class _Figures(BaseModel):
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    def _named(self, prefix: str = "", skip: tuple[str, ...] = ()) -> Figures:
        """This record's figures that were measured (not None), each under `prefix` + field."""
        return {
            prefix + k: v
            for k, v in self
            if k not in skip and v is not None and isinstance(v, (int, float))
        }


class RankFigures(_Figures):
    """One cluster worker's figures over the whole run (`rank{rank}/...` in MLflow). A worker
    its plan did not launch has local batch and busy fraction 0 and no other figure."""

    rank: int = Field(description="The cluster's worker index (the launched rank, unmapped).")
    local_batch: int = Field(description="Its local batch at the last step.")
    busy_fraction: float
    compute_s: float | None = None
    comm_s: float | None = None
    data_wait_s: float | None = None
    idle_s: float | None = None
    samples_per_s: float | None = Field(None, description="Samples over its compute time.")
    comm_bytes: float | None = Field(None, description="Bytes on the wire (a share of a ring's).")
    inner_steps_per_round: float | None = Field(
        None, description="Strategy 'diloco': its mean inner steps per round."
    )
    cost_usd: float | None = None
    state_bytes: int | None = Field(
        None, description="Parameters, gradients and optimizer state it held (its shards: fsdp)."
    )
    peak_memory_bytes: int | None = Field(
        None, description="Peak allocated on its GPU; on a CPU, its process's peak RSS."
    )
    startup_s: float | None = Field(None, description="From submit to its first step.")
    # its start-up by phase (`records.StartupPhases`), where its launcher marked them
    startup_spawn_s: float | None = None
    startup_import_s: float | None = None
    startup_rendezvous_s: float | None = None
    startup_data_s: float | None = None
    startup_model_s: float | None = None
    startup_first_step_s: float | None = None

    def flat(self) -> Figures:
        return self._named(f"rank{self.rank}/", skip=("rank",))


class RunMetrics(_Figures):
    """The run's figures (docs/metrics.md says what each is); None where not measured."""

    throughput_samples_per_s: float = 0.0
    train_loop_s: float = 0.0
    comm_bytes_total: float = 0.0
    comm_bytes_per_step: float = 0.0
    steps: int = 0
    rounds: int | None = Field(None, description="Strategy 'diloco': the rounds run (its steps).")
    replans: int = 0
    restarts: int = 0
    steps_redone: int = 0
    workers_left_out: int = 0
    workers_lost_in_place: int = 0
    steps_retried: int = 0
    busy_fraction: float = 0.0
    comm_fraction: float = 0.0
    straggler_idle_fraction: float = 0.0
    tracking_overhead_fraction: float = 0.0
    data_wait_fraction: float = 0.0
    s3_bytes_read: int = 0
    cache_hit_ratio: float = 0.0
    # the recipe's evaluation
    final_accuracy: float | None = None
    final_val_loss: float | None = None
    final_perplexity: float | None = None
    time_to_target_s: float | None = None
    time_to_target_wall_s: float | None = None
    # rank 0's wall clock (`training.metrics.wall_figures`)
    startup_s: float | None = None
    # rank 0's start-up by phase (`training.launch.startup`); with trials_s they add up to it
    startup_spawn_s: float | None = None
    startup_import_s: float | None = None
    startup_rendezvous_s: float | None = None
    startup_data_s: float | None = None
    startup_model_s: float | None = None
    startup_first_step_s: float | None = None
    trials_s: float | None = None
    eval_s: float | None = None
    checkpoint_s: float | None = None
    steps_wall_s: float | None = None
    steady_samples_per_s: float | None = None
    # what the launcher and the variant's job paid (`training.metrics.end_to_end`)
    run_time_s: float | None = None
    profiling_time_s: float | None = None
    end_to_end_s: float | None = None
    end_to_end_time_to_target_s: float | None = None
    cost_usd: float | None = None
    cost_per_epoch_usd: float | None = None
    ranks: list[RankFigures] = []

    def flat(self) -> Figures:
        """Every figure measured, under its MLflow name: the run's, then `rank{r}/NAME`."""
        out = self._named()
        for r in self.ranks:
            out |= r.flat()
        return out


class StepRank(_Figures):
    """One worker at one step: its share of the step's time computing, and its local batch."""

    rank: int
    busy_fraction: float
    local_batch: int


class StepFigures(_Figures):
    """One step: the global mean loss, rank 0's step time, and each worker's figures."""

    step: int
    loss: float
    step_time_s: float
    ranks: list[StepRank] = []

    def flat(self) -> Figures:
        """The step's row of per-step series, under MLflow's names (`rank{r}/local_batch`)."""
        out = self._named()
        for r in self.ranks:
            out |= r._named(f"rank{r.rank}/", skip=("rank",))
        return out
