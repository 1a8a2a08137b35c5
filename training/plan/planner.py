"""Turn a profile into a variant's plan: local batches and the gradient communication (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from hetflow.config import ClusterSpec, ConfigError, TrainConfig
from hetflow.perf.balance import balanced_time
from hetflow.perf.collective import measured_ring
from hetflow.perf.curve import Line
from hetflow.records import CompressionMethod, Plan, Profile
from hetflow.training.plan.balance import (
    PlanError,
    balance_among,
    balance_batches,
    balance_with_exclusion,
    balanced_step_time,
    equal_batches,
    micro_split,
    plan_batches,
)
from hetflow.training.plan.compression import (
    auto_candidates,
    choose_compression,
    too_short_for_trials,
)
from hetflow.training.plan.ranks import RankMap
from hetflow.training.plan.rounds import round_plan, round_samples


def memory_caps(profile: Profile, cluster: ClusterSpec) -> list[int | None]:
    """Each worker's largest local batch: the one its profile measured (an out-of-memory
    search on CUDA, the resident-memory model on a CPU: `probes.memory`), or the one the user
    declared where that is lower. A declared cap above the measured one is a ConfigError naming
    the worker: the device does not hold it."""
    caps: list[int | None] = []
    for w, r in zip(cluster.workers, profile.ranks, strict=True):
        measured = r.memory_cap_batch  # None: not measured; 0: holds no sample
        if (
            w.memory_cap_batch is not None
            and measured is not None
            and w.memory_cap_batch > measured
        ):
            raise ConfigError(
                f"cluster.workers[{w.name}].memory_cap_batch: {w.memory_cap_batch} is more than "
                f"the {measured} samples {w.name}'s device holds (measured by the profile)"
            )
        caps.append(w.memory_cap_batch if w.memory_cap_batch is not None else measured)
    return caps


def make_plan(profile: Profile, cluster: ClusterSpec, train: TrainConfig) -> Plan:
    """The plan of a job: a round's, in inner steps, under strategy 'diloco'
    (`rounds.round_plan`); else the synchronous step's (`step_plan`)."""
    if train.strategy == "diloco":
        return round_plan(profile, cluster, train)
    return step_plan(profile, cluster, train)


def step_plan(profile: Profile, cluster: ClusterSpec, train: TrainConfig) -> Plan:
    """Local batches from the profile's step models (`Profile.step_models`), the workers'
    memory caps (`memory_caps`) and the schedule, with the workers too slow to help left out
    (`balance.exclude_slow`, which reads a worker's step at the smallest batch its profile
    measured in place of its extrapolated fixed cost; never under the equal split) or whose
    samples buy less than their hops of the all-reduce cost (`leave_out_for_comm`), and of
    those the workers not launched (`drop_from_launch`); from a prior (`Profile.prior`) no
    worker is left out, so that the run measures every one; the compression as
    `plan_compression` plans it for the workers launched ('auto': the candidates they try).
    With `train.accumulate` 'auto' a share may pass its worker's cap, as micro-batches that
    each pay the worker's fixed cost (`balance.micro_cost`; `with_micro` records them)."""
    speeds = [r.samples_per_s for r in profile.ranks]
    latency, per_sample = profile.step_models()
    caps = memory_caps(profile, cluster)
    micro, excluded = train.accumulate == "auto", []
    if train.schedule == "equal":
        batches = equal_batches(cluster.world_size, train.global_batch)
    else:
        names = [w.name for w in cluster.workers]
        measured_from = [min(r.compute_batches, default=None) for r in profile.ranks]
        if profile.prior:  # nothing measured yet: every worker computes, so each is measured
            batches = balance_batches(per_sample, latency, train.global_batch, caps, micro)
        else:
            batches, excluded = balance_with_exclusion(
                per_sample,
                latency,
                train.global_batch,
                caps,
                names,
                min_batches=measured_from,
                micro=micro,
            )
        model = StepModel(
            latency, per_sample, caps, train.global_batch, *allreduce_of(profile), micro=micro
        )
        batches, for_comm = leave_out_for_comm(batches, model, names)
        excluded += for_comm
    plan = with_micro(
        Plan(
            local_batches=batches,
            speeds=speeds,
            latency_s=latency,
            per_sample_s=per_sample,
            caps=caps,
            excluded=excluded,
        ),
        train,
    )
    dropped = drop_from_launch(plan, train, *allreduce_of(profile))
    plan.dropped = [cluster.workers[i].name for i in dropped]
    method, reason, candidates = plan_compression(
        profile, RankMap(cluster, plan).launched()[0], train
    )
    return plan.model_copy(
        update={
            "compression": method,
            "compression_reason": reason,
            "compression_candidates": candidates,
        }
    )


def with_micro(plan: Plan, train: TrainConfig) -> Plan:
    """`plan` with each worker's micro-batches recorded (`Plan.micro_batch`, `micro_count`:
    `balance.micro_split` of its share under its cap) where `train.accumulate` is 'auto';
    `plan` as it is otherwise.

    >>> p = with_micro(Plan(local_batches=[3, 15, 0], caps=[4, 4, None]),
    ...                TrainConfig(accumulate="auto"))
    >>> p.micro_batch, p.micro_count
    ([3, 4, 0], [1, 4, 0])
    """
    if train.accumulate != "auto":
        return plan
    caps = plan.caps or [None] * len(plan.local_batches)
    parts = [micro_split(b, c) for b, c in zip(plan.local_batches, caps, strict=True)]
    return plan.model_copy(
        update={
            "micro_batch": [max(p, default=0) for p in parts],
            "micro_count": list(map(len, parts)),
        }
    )


IDLE_RANK_BUDGET = 0.01  # the share of the step an idle rank kept for a re-plan may cost
LEAVE_OUT_GAIN = 0.02  # the predicted gain, a share of the step, that leaves a worker out


def allreduce_of(profile: Profile) -> tuple[float, float]:
    """The all-reduce of one gradient over every worker, and its fixed part: the profile's
    slowest rank's figures (`grad_allreduce_s`, `allreduce_latency_s`)."""
    slowest = max(profile.ranks, key=lambda r: r.grad_allreduce_s)
    return slowest.grad_allreduce_s, slowest.allreduce_latency_s


@dataclass(frozen=True)
class StepModel:
    """A synchronous step's predicted time (pure): the balanced compute of the ranks that
    compute (`balanced_step_time` of a_i + c_i x b_i under the caps) plus the all-reduce of one
    gradient over the ranks in the ring (`hetflow.perf.collective.measured_ring` of the one
    measured over every worker, `allreduce_s`, whose fixed part is `allreduce_latency_s`)."""

    latency_s: list[float]
    per_sample_s: list[float]
    caps: list[int | None]
    global_batch: int
    allreduce_s: float = 0.0
    allreduce_latency_s: float = 0.0
    micro: bool = False  # shares past the caps, as micro-batches (`balanced_step_time`)

    def step(self, computing: list[int], in_ring: int | None = None) -> float:
        """The step of the ranks `computing`, in a ring of `in_ring` ranks (those computing
        unless given: a rank at batch 0 joins the all-reduce where it cannot leave it,
        `training.computing`)."""
        compute = balanced_step_time(
            [self.latency_s[i] for i in computing],
            [self.per_sample_s[i] for i in computing],
            self.global_batch,
            [self.caps[i] for i in computing],
            self.micro,
        )
        ring = len(computing) if in_ring is None else in_ring
        world = len(self.latency_s)
        return compute + measured_ring(self.allreduce_s, world, ring, self.allreduce_latency_s)


def leave_out_for_comm(
    batches: list[int], model: StepModel, names: list[str]
) -> tuple[list[int], list[str]]:
    """`batches` with the workers left out whose samples buy less than their hops of the
    all-reduce cost (pure), and why. Greedy: the worker whose leaving shortens the predicted
    step (`model.step`) most goes first, while that gain is more than `LEAVE_OUT_GAIN` of the
    step; the others are balanced anew (`balance_among`). The scheduler's own rule
    (`exclude_slow`) prices compute only: a worker whose share is a few samples still adds its
    hops to every all-reduce.

    >>> m = StepModel([0.01, 0.01, 0.03], [1e-3, 1e-3, 3e-3], [None] * 3, 128, 0.02, 0.02)
    >>> leave_out_for_comm([60, 60, 8], m, ["a", "b", "c"])[0]
    [64, 64, 0]
    >>> free = StepModel(m.latency_s, m.per_sample_s, m.caps, 128)  # no all-reduce
    >>> leave_out_for_comm([60, 60, 8], free, ["a", "b", "c"])[0]
    [60, 60, 8]
    """
    batches, why = list(batches), []
    kept = [i for i, b in enumerate(batches) if b > 0]
    now = model.step(kept)
    while model.allreduce_s > 0 and len(kept) > 1:
        after, best = min((model.step([j for j in kept if j != i]), i) for i in kept)
        if not now - after > LEAVE_OUT_GAIN * now:
            break
        rest = [j for j in kept if j != best]
        batches = balance_among(
            model.per_sample_s, model.latency_s, model.global_batch, model.caps, rest, model.micro
        )
        why.append(
            f"{names[best]}: its share buys less than its hops of the all-reduce cost: the "
            f"step is predicted {after:.3g} s without it against {now:.3g} s with it"
        )
        kept = [i for i, b in enumerate(batches) if b > 0]  # a share may round to 0
        now = model.step(kept)
    return batches, why


def drop_from_launch(
    plan: Plan, train: TrainConfig, allreduce_s: float, latency_s: float = 0.0
) -> list[int]:
    """The ranks the plan leaves at batch 0 that are not launched at all (pure).

    A rank launched at batch 0 joins the all-reduce with a zero gradient: for the whole run
    where it cannot leave it, else for the first two steps (`training.computing`), and every
    step's all-gather of step times. This prices it as if it joined every all-reduce, the
    larger cost: its hops of the ring (the whole all-reduce where one rank would otherwise
    compute alone); on a GPU cluster it holds the process group on gloo. Under a
    static plan ('proportional') nothing can bring it back, so it is never launched. Under
    'dynamic' it stays in, at batch 0, so that a re-plan can bring it back, only where that is
    nearly free: where launching without it is predicted (`StepModel.step` on the plan's model,
    the all-reduce over every rank `allreduce_s` with its fixed part `latency_s`) to shorten
    the step by less than `IDLE_RANK_BUDGET` (1%). Keeping them costs every step of the run,
    for a re-plan that brings them back only when another worker slows past them, so the
    budget is small. Equal splits leave no rank out.

    >>> p = Plan(local_batches=[128, 0, 0], latency_s=[0.004, 0.2, 0.2],
    ...          per_sample_s=[1e-5, 1e-3, 1e-3])
    >>> drop_from_launch(p, TrainConfig(schedule="proportional"), 0.001)
    [1, 2]
    >>> drop_from_launch(p, TrainConfig(schedule="dynamic"), 0.001)  # 0.001 of a 0.0063 s step
    [1, 2]
    >>> drop_from_launch(p, TrainConfig(schedule="dynamic"), 0.00005)  # 0.9% of the step: kept
    []
    """
    out = [i for i, b in enumerate(plan.local_batches) if b == 0]
    if not out or train.schedule == "equal":
        return []
    if train.schedule == "proportional":
        return out
    n, g = len(plan.local_batches), train.global_batch
    model = StepModel(
        plan.latency_s,
        plan.per_sample_s,
        plan.caps or [None] * n,
        g,
        allreduce_s,
        latency_s,
        micro=train.accumulate == "auto",
    )
    kept = [i for i, b in enumerate(plan.local_batches) if b > 0]
    with_them = model.step(kept, in_ring=n)
    return out if with_them - model.step(kept) > IDLE_RANK_BUDGET * with_them else []


def replan_without(
    cluster: ClusterSpec, plan: Plan, lost: dict[str, str], train: TrainConfig
) -> Plan:
    """`plan` over `cluster` with the workers `lost` names (name -> why) left out, and
    `train.global_batch` shared anew by the others (pure): at batch 0, the lost workers join
    `dropped` (so `RankMap.launched` leaves them out and renumbers the rest) and `excluded`
    with why. Under diloco the batch shared is a round's (`rounds.round_samples`).
    The others' shares: equal under the 'equal' schedule; balanced on the plan's step model
    where it has one (`balance_with_exclusion`, which may leave more at batch 0, each in
    `excluded`); else in the ratio of their shares in `plan` (a share of 0 counts as 1). A
    PlanError when no worker is left.

    >>> c = ClusterSpec.from_speeds([1, 1, 1])
    >>> p = replan_without(c, Plan.equal([16, 8, 24]), {"w1": "node lost"}, TrainConfig(
    ...     global_batch=48))
    >>> p.local_batches, p.dropped, p.excluded
    ([19, 0, 29], ['w1'], ['w1: node lost'])
    """
    keep = [
        i
        for i, w in enumerate(cluster.workers)
        if w.name not in lost and w.name not in plan.dropped
    ]
    if not keep:
        gone = "; ".join(f"{name}: {why}" for name, why in lost.items())
        raise PlanError(f"cluster: no worker is left to go on with: {gone}")
    g = round_samples(train, len(keep)) if train.strategy == "diloco" else train.global_batch
    names = [cluster.workers[i].name for i in keep]

    def pick(values: list) -> list:
        return [values[i] for i in keep]

    caps = pick(plan.caps) if plan.caps else [w.memory_cap_batch for w in pick(cluster.workers)]
    excluded = [f"{n}: {why}" for n, why in lost.items()]
    if train.schedule == "equal":
        part = equal_batches(len(keep), g)
    elif plan.latency_s and plan.per_sample_s:
        part, why = balance_with_exclusion(
            pick(plan.per_sample_s),
            pick(plan.latency_s),
            g,
            caps,
            names,
            micro=train.accumulate == "auto",
        )
        excluded += why
    else:
        micro = train.accumulate == "auto"  # shares past the caps run as micro-batches
        part = plan_batches(
            [max(b, 1) for b in pick(plan.local_batches)], g, None if micro else caps
        )
    batches = [0] * len(cluster.workers)
    for i, b in zip(keep, part, strict=True):
        batches[i] = b
    update = {
        "local_batches": batches,
        "excluded": [*plan.excluded, *excluded],
        "dropped": [*plan.dropped, *lost],
    }
    return with_micro(plan.model_copy(update=update), train)


def plan_compression(
    profile: Profile, cluster: ClusterSpec, train: TrainConfig
) -> tuple[CompressionMethod, str, list[CompressionMethod]]:
    """(method, why, candidates): the method the train config sets; for 'auto', 'none' and the
    candidates the workers try at the start of the run (`auto_candidates`, `training.trials`),
    'none' untried where the run is too short for trials to pay (`too_short_for_trials`), or
    where nothing can be tried (one worker) the profile's rule (`choose_compression`)."""
    if train.compression != "auto":
        return train.compression_method(), "set in the train config", []
    candidates = auto_candidates(train, cluster)
    if why := too_short_for_trials(train, candidates):
        return CompressionMethod(), why, []
    if not candidates:
        method, reason = choose_compression(profile.comm_share())
        return method, f"'auto' on one worker, from the profile: {reason}", []
    tried = ", ".join(str(m) for m in candidates)
    why = f"'auto': the workers try {tried} at the start of the run and keep the fastest"
    return CompressionMethod(), why, candidates


def ideal_throughput(latency: list[float], per_sample: list[float], global_batch: int) -> float:
    """Samples/s if every rank computed its balanced share with no wait and no communication
    (the model's balanced step on the ranks' lines, no cap)."""
    lines = [Line(a, c) for a, c in zip(latency, per_sample, strict=True)]
    return global_batch / balanced_time(lines, global_batch)


def fastest_alone(plan: Plan, cluster: ClusterSpec, global_batch: int) -> Plan:
    """`plan` with the whole global batch on the worker whose modelled step at that batch is
    shortest (among those whose cap holds it) and every other worker dropped: the reference
    'drop the slow workers' that a plan must not fall below (pure).

    >>> p = Plan(local_batches=[40, 88], latency_s=[0.001, 0.004], per_sample_s=[1e-3, 1e-5])
    >>> alone = fastest_alone(p, ClusterSpec.from_speeds([1, 1]), 128)
    >>> alone.local_batches, alone.dropped
    ([0, 128], ['w0'])
    """
    n = len(plan.local_batches)
    caps = plan.caps or [None] * n
    able = [i for i in range(n) if caps[i] is None or caps[i] >= global_batch]
    if not able:
        raise PlanError(f"caps: no worker's memory cap holds the global batch of {global_batch}")
    best = min(able, key=lambda i: plan.latency_s[i] + plan.per_sample_s[i] * global_batch)
    names = [w.name for w in cluster.workers]
    return plan.model_copy(
        update={
            "local_batches": [global_batch if i == best else 0 for i in range(n)],
            "excluded": [
                f"{names[i]}: the 'fastest' variant runs {names[best]} alone"
                for i in range(n)
                if i != best
            ],
            "dropped": [names[i] for i in range(n) if i != best],
        }
    )
