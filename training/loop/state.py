"""The training loop's state from step to step: the plan in force and its history, the step
records and evaluations, and the rows of compute times the re-balancer is fed from."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hetflow.records import CompressionTrials, EvalPoint, PlanChange, StepRecord

# Steps of the plan in force kept for `Rebalancer.sudden_change` (it compares a rank's last
# SUDDEN_STEPS with its median over the rest).
SUDDEN_ROWS = 12
# Steps that run new batch shapes, at the start and after each re-plan, pay one-off costs (the
# allocator, kernel choice) well above the settled time (docs/measurements/emulation.md). The
# re-balancer does not see them, or it takes the first settled steps for a sudden speed-up.
SETTLE_STEPS = 2


@dataclass
class LoopState:
    """What the training loop carries from step to step.

    `plan` is the local batches in force, `plans` every plan adopted with its first step.
    `current` and `window` hold rows of compute times (rank by rank) of the steps run on the
    plan in force, its first SETTLE_STEPS left out: since the plan came in or the last sudden
    change (`current`, at most SUDDEN_ROWS), and since the last look at the plan (`window`).
    A checkpoint keeps all but the rows (`Checkpoint`), which start empty on resume.
    """

    plan: list[int]
    plans: list[PlanChange]
    evals: list[EvalPoint] = field(default_factory=list)
    records: list[StepRecord] = field(default_factory=list)
    train_time_s: float = 0.0
    start: int = 0
    current: list[list[float]] = field(default_factory=list)
    window: list[list[float]] = field(default_factory=list)
    bookkeeping_s: float = 0.0  # what recording progress costs the training loop

    @classmethod
    def fresh(cls, plan: list[int]) -> LoopState:
        return cls(plan=list(plan), plans=[PlanChange(step=0, plan=list(plan))])

    @classmethod
    def from_checkpoint(cls, ckpt: Checkpoint, rank: int) -> LoopState:
        """The state `ckpt` holds for `rank`: the plan in force, its history, the evaluations,
        the training time and this rank's step records; the rows start empty."""
        return cls(
            plan=list(ckpt.plan),
            start=ckpt.step,
            train_time_s=ckpt.train_time_s,
            plans=list(ckpt.plans),
            evals=list(ckpt.evals),
            records=list(ckpt.records[rank]),
        )

    def add_row(self, tag: int, step: int, row: list[float]) -> None:
        """Keep every rank's compute time of `step`, run under plan number `tag` (the length of
        `plans` then), if it ran on the plan in force and after its first SETTLE_STEPS."""
        if tag == len(self.plans) and step >= self.plans[-1].step + SETTLE_STEPS:
            self.current = [*self.current[-SUDDEN_ROWS + 1 :], row]
            self.window.append(row)

    def adopt(self, plan: list[int], step: int) -> None:
        """Run `plan` from `step` on; its rows start afresh (the window's too: a row of the
        plan before pairs its times with another plan's batches, as after a regroup in place,
        which re-cuts the plan without the window being observed first)."""
        self.plan = plan
        self.plans.append(PlanChange(step=step, plan=list(plan)))
        self.current, self.window = [], []


@dataclass
class Checkpoint:
    """What a checkpoint holds after `step` steps on `workers`: the model, optimizer, lr
    scheduler, comm hook, loss scale and re-balancer state (as their `state_dict`s give them,
    the same on every rank or rank 0's), the loop's plan, plans, evaluations and training
    time, 'auto''s trials, every rank's step records, and the strategy. Under fsdp `model` and
    `optimizer` are empty and `shards` names the checkpoint's DCP folder in the store, which
    every rank wrote its shards into (`sharded.save_shards`). `to_dict` is what
    `CheckpointStore` saves, `from_dict` reads it back: the one place its keys are written."""

    step: int
    workers: list[str]
    model: dict
    optimizer: dict
    plan: list[int]
    plans: list[PlanChange]
    evals: list[EvalPoint]
    train_time_s: float
    rebalancer: dict | None  # None: the re-balancer starts afresh on resume (`moved`)
    comm: dict | None
    trials: CompressionTrials | None
    scaler: dict
    records: list[list[StepRecord]]  # rank by rank
    scheduler: dict | None = None  # the lr scheduler's position; None in an older checkpoint
    strategy: str = "ddp"  # `TrainConfig.strategy`: how `model` and `optimizer` are keyed
    shards: str | None = None  # fsdp: the DCP folder, relative to the store

    def check_strategy(self, strategy: str) -> None:
        """A ValueError where this checkpoint was taken under another strategy: DDP's
        optimizer state is keyed by parameter index, fsdp's by name."""
        if strategy != self.strategy:
            raise ValueError(
                f"train.strategy: the checkpoint of step {self.step} was taken under "
                f"{self.strategy!r}, this run is {strategy!r}; resume it with {self.strategy!r}"
            )

    def to_dict(self) -> dict:
        return {
            "step": self.step,
            "workers": list(self.workers),
            "model": self.model,
            "optimizer": self.optimizer,
            "plan": list(self.plan),
            "plans": [p.model_dump() for p in self.plans],
            "evals": [e.model_dump() for e in self.evals],
            "train_time": self.train_time_s,
            "rebalancer": self.rebalancer,
            "comm": self.comm,
            "trials": self.trials.model_dump(mode="json") if self.trials else None,
            "scaler": self.scaler,
            "records": [[r.model_dump() for r in rank] for rank in self.records],
            "scheduler": self.scheduler,
            "strategy": self.strategy,
            "shards": self.shards,
        }

    @classmethod
    def from_dict(cls, saved: dict, workers: list[str]) -> Checkpoint:
        """A checkpoint as `to_dict` wrote it; one that names no workers was taken on
        `workers`."""
        trials = saved.get("trials")
        return cls(
            step=saved["step"],
            workers=list(saved.get("workers", workers)),
            model=saved["model"],
            optimizer=saved["optimizer"],
            plan=list(saved["plan"]),
            plans=[PlanChange.model_validate(p) for p in saved["plans"]],
            evals=[EvalPoint.model_validate(e) for e in saved["evals"]],
            train_time_s=saved["train_time"],
            rebalancer=saved["rebalancer"],
            comm=saved.get("comm"),
            trials=CompressionTrials.model_validate(trials) if trials else None,
            scaler=saved.get("scaler", {}),
            records=[[StepRecord.model_validate(r) for r in rank] for rank in saved["records"]],
            scheduler=saved.get("scheduler"),
            strategy=saved.get("strategy", "ddp"),
            shards=saved.get("shards"),
        )

    def moved(self, workers: list[str], plan: list[int]) -> Checkpoint:
        """This checkpoint as resumed on `workers`, of which some or none were its own (a
        job the queue gives other workers at a checkpoint), with `plan` (pure).

        As `narrowed` for workers all its own; with a new one, the step records start afresh
        on every worker (the run's per-step figures cover the steps since, on the same
        workers) and so does the re-balancer (its figures were the old workers'); the model,
        optimizer, comm hook, scaler, evaluations and trials are kept whole."""
        new = [w for w in workers if w not in self.workers]
        if not new:
            return self.narrowed(workers, plan)
        return replace(
            self,
            workers=list(workers),
            plan=list(plan),
            plans=[*self.plans, PlanChange(step=self.step, plan=list(plan))],
            records=[[] for _ in workers],
            rebalancer=None,
        )

    def narrowed(self, workers: list[str], plan: list[int]) -> Checkpoint:
        """This checkpoint as resumed on `workers`, some of its own in the same order (a run
        that goes on without the workers of a lost node: `ray_train`), with `plan`, of the
        same global batch, in force from its step (pure).

        Model, optimizer, comm hook, scaler, evaluations and trials are kept whole; each
        rank's step records and re-balancer figures are its worker's (`narrowed_state`). The
        data stream needs nothing: step t reads positions [t x B, (t + 1) x B) whatever the
        plan is, so with B kept every sample is still read once per epoch. A ValueError naming
        a worker the checkpoint lacks."""
        new = [w for w in workers if w not in self.workers]
        if new:
            raise ValueError(
                f"checkpoint: workers {new} were not in the run it was taken on "
                f"({self.workers}); a run goes on with fewer workers, never new ones"
            )
        keep = [self.workers.index(w) for w in workers]
        return replace(
            self,
            workers=list(workers),
            plan=list(plan),
            plans=[*self.plans, PlanChange(step=self.step, plan=list(plan))],
            records=[self.records[i] for i in keep],
            rebalancer=narrowed_state(self.rebalancer, keep),
        )


def narrowed_state(state: dict, keep: list[int]) -> dict:
    """`Rebalancer.state()` of a run as it goes on with the ranks `keep` (old rank of each new
    one, in order) alone: each rank's measurements are its worker's; the log of re-plans and
    the model's errors stay; the plans of the old ranks (rejected, on trial, to revert to)
    mean nothing on the new ones and are dropped (pure)."""
    per_rank = ("per_sample_s", "points", "latest")
    picked = {k: None if state.get(k) is None else [state[k][i] for i in keep] for k in per_rank}
    return {
        **state,
        **picked,
        "rejected": [],
        "trial": None,
        "revert_to": None,
        "tried": [],
        "last_plan": None,
        "counts": [state["counts"][i] for i in keep] if state.get("counts") else [],
    }
