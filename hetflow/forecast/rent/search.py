"""Which machines to rent: how many of each candidate instance type, and the batch
plan among them, for a job of `steps` steps of `global_batch` samples (pure, no I/O).

The model, term by term (docs/recommend.md):

- One device's compute step at local batch b is a published per-batch curve: the emulator's
  presets (`hetflow.emulation.presets`: ResNet-50 v1.5 inference latency, mixed precision) x 3
  (forward + backward, the simulator's rule) x the model's FLOPs per sample over ResNet-50's.
  The preset is the GPU the catalog lists: T4 (g4dn.*), V100 (p3.*, p3dn.*), A100 (p4d.*,
  p4de.*). Other GPUs have no curve and are refused (`curve_for`). The curve is made
  non-decreasing (a step of b samples never beats one of fewer), and past the last published
  batch it grows in proportion to b (`PUBLISHED_BATCH`). A curve ends at the largest local
  batch the device's memory holds (`simulate.memory`, applied by `rent.rental`) or at a
  largest local batch the user gives.
- A mix's step: the balanced compute time T, the least T at which every device taking the most
  samples its curve finishes within T holds the global batch (the performance model's solver,
  `hetflow.perf.balance.balanced_time`, that the planner uses, on the curve itself rather than
  an affine fit of it; a type whose
  one-sample step exceeds T takes nothing, the rule of `exclude_slow`), then the simulator's
  step (`step.step_time`) with the all-reduce of the fp32 gradient (`step.allreduce_s`: one
  ring, the slowest NIC between instances, the GPU family's bus inside one; no overlap with
  compute, no jitter, no overhead: the `Job`'s and `Network`'s defaults).
- Cost: every rented instance's on-demand hourly price x the predicted time (per-second
  billing; start-up, data loading and evaluation are not counted). On spot (`markets`), the
  spot price, and time and cost are expectations with interruptions (`rent.spot`).

`search` picks the mix for an objective: 'cost' (least cost, i.e. per sample), 'deadline'
(least cost predicted within `deadline_h`, less a margin), 'budget' (least time within
`budget_usd`). It evaluates every mix where the candidates allow few (`EXHAUSTIVE`), else every
mix of up to `PRUNED_TYPES` types on a geometric grid of counts, every count of each type alone,
then improves the best ones by +-1 instance steps; once per market (a mix is rented all
on-demand or all on spot). A RecommendError (one line) says when no
mix satisfies the objective.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hetflow.config import ConfigError
from hetflow.emulation.presets import PRESETS
from hetflow.forecast.rent.mix import Candidate, Prediction
from hetflow.forecast.rent.objective import Objective, by_cost, by_hours, pareto
from hetflow.forecast.rent.spot import DEFAULT_RESTART, Restart, expected_hours
from hetflow.forecast.simulate.job import Job, Network
from hetflow.forecast.simulate.models import MODELS, ModelSpec
from hetflow.forecast.simulate.step import NodeGroup, allreduce_s, step_time
from hetflow.perf.balance import balanced_time

PRESET_OF_GPU = {"T4": "t4", "V100": "v100", "A100": "a100"}
TRAIN_OVER_INFERENCE = 3.0  # forward + backward ~ 3 x forward (as the simulator counts FLOPs)
CURVE_MODEL = "resnet50"  # the model the presets' curves were published for
PUBLISHED_BATCH = max(max(p.latency_ms) for p in PRESETS.values())  # beyond: extrapolated
OBJECTIVES = ("cost", "deadline", "budget")
EXHAUSTIVE = 20_000  # mixes evaluated one by one when the candidates allow no more than this
PRUNED_TYPES = 3  # beyond it: mixes of at most this many types, on GRID counts
GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
CLIMB_FROM = 5  # the best mixes of the grid each climbed by +-1 instance steps


class RecommendError(ConfigError):
    """A job or a set of candidates no recommendation can be made for: one line."""


def curve_for(instance_type: str, gpu: str | None, model: ModelSpec, max_batch: int):
    """(preset name, step seconds for b = 1..max_batch) of one device of this GPU, or a
    RecommendError naming the type and the GPUs that have a published curve (the caller says
    what else would give it one: `rental.no_history`)."""
    preset = PRESETS.get(PRESET_OF_GPU.get(gpu or "", ""))
    if preset is None:
        known = ", ".join(f"{g} ({p})" for g, p in PRESET_OF_GPU.items())
        raise RecommendError(
            f"--candidates: {instance_type} ({gpu or 'no GPU'}) has no step-time curve: "
            f"published curves exist for {known} (hetflow/emulation/presets.py)"
        )
    scale = TRAIN_OVER_INFERENCE * model.per_sample_flops / MODELS[CURVE_MODEL].per_sample_flops
    per_sample_best = preset.best_ms_per_sample
    steps, top = [], 0.0
    for b in range(1, max_batch + 1):
        top = max(top, preset.shape(b) * b * per_sample_best * scale / 1e3)
        steps.append(top)
    return preset.name, tuple(steps)


def comm_s(
    cands: Sequence[Candidate], counts: Sequence[int], model: ModelSpec, network: Network
) -> float:
    """One step's all-reduce of the fp32 gradient over every rented GPU, as the simulator
    counts it (`step.allreduce_s`): each instance a node of its GPUs."""
    groups = [
        NodeGroup(c.devices, n, c.nic_gbps, c.intra_gbps)
        for c, n in zip(cands, counts, strict=True)
        if n
    ]
    return allreduce_s(groups, model.grad_bytes, network)


def balanced_compute_s(
    cands: Sequence[Candidate], counts: Sequence[int], global_batch: int, levels: Sequence[float]
) -> float | None:
    """The least step time (one of `levels`, every curve's values sorted) at which the rented
    devices hold the global batch; None when some rented type would take no sample or some
    device none (the mix without it is as fast and cheaper)."""
    used = [(c, c.devices * n) for c, n in zip(cands, counts, strict=True) if n]
    if not used or sum(d for _, d in used) > global_batch:
        return None
    curves, devices = [c.curve for c, _ in used], [d for _, d in used]
    caps = [len(c.step_s) for c, _ in used]  # no batch past a curve's last
    t = balanced_time(curves, global_batch, caps, counts=devices, levels=levels)
    if math.isinf(t):
        return None  # the devices' largest batches do not hold it
    if any(c.batch_within(t) == 0 for c, _ in used):
        return None
    return t


class Evaluator:
    """Predictions of mixes of `cands` for `job` in `market`, each computed once."""

    def __init__(
        self,
        cands: Sequence[Candidate],
        job: Job,
        market: str = "on-demand",
        restart=DEFAULT_RESTART,
        network: Network | None = None,
    ):
        self.cands, self.job, self.market = list(cands), job, market
        self.restart = restart or DEFAULT_RESTART
        self.network = network or Network()  # the simulator's defaults
        self.levels = sorted({s for c in cands for s in c.step_s})
        self.seen: dict[tuple[int, ...], Prediction | None] = {}

    def __call__(self, counts: Sequence[int]) -> Prediction | None:
        key = tuple(counts)
        if key not in self.seen:
            self.seen[key] = self._predict(key)
        return self.seen[key]

    def _predict(self, counts: tuple[int, ...]) -> Prediction | None:
        if any(n < 0 or n > c.available for c, n in zip(self.cands, counts, strict=True)):
            return None
        job = self.job
        compute = balanced_compute_s(self.cands, counts, job.global_batch, self.levels)
        if compute is None:
            return None
        comm = comm_s(self.cands, counts, job.model, self.network)
        devices = sum(c.devices * n for c, n in zip(self.cands, counts, strict=True))
        step = step_time(compute, compute, comm, devices, job, self.network)[0]
        bare = step * job.steps / 3600
        used = [(c, n) for c, n in zip(self.cands, counts, strict=True) if n]
        if self.market == "on-demand":
            rate = sum(c.usd_per_hour * n for c, n in used)
            return Prediction(counts, step, compute, comm, bare, rate * bare, rate, bare_hours=bare)
        rate = sum(c.spot_usd_per_hour * n for c, n in used)
        per_hour = sum(c.interruptions_per_hour * n for c, n in used)
        hours = expected_hours(bare, per_hour, self.restart.lost_s(step, job.steps))
        if hours is None:
            return None  # interrupted faster than it recovers: expected never to finish
        fig = (hours, rate * hours, rate, "spot", per_hour * hours, bare)
        return Prediction(counts, step, compute, comm, *fig)

    def predictions(self) -> list[Prediction]:
        return [p for p in self.seen.values() if p is not None]

    def priced(self) -> int:
        """How many mixes within the candidates' availability were looked at."""
        return sum(
            all(0 <= n <= c.available for c, n in zip(self.cands, k, strict=True))
            for k in self.seen
        )


def local_batches(cands: Sequence[Candidate], p: Prediction, global_batch: int) -> list[list[int]]:
    """Each rented device's local batch, per candidate (instance by instance, GPU by GPU):
    the most its curve computes within the balanced step, less the surplus, taken one sample
    at a time from the devices whose step is longest."""
    pairs = zip(cands, p.counts, strict=True)
    out = [[c.batch_within(p.compute_s)] * (c.devices * n) for c, n in pairs]
    surplus = sum(map(sum, out)) - global_batch
    while surplus > 0:
        i, j = max(
            ((i, j) for i, bs in enumerate(out) for j in range(len(bs)) if bs[j] > 1),
            key=lambda ij: (cands[ij[0]].step_s[out[ij[0]][ij[1]] - 1], -ij[1]),
        )
        out[i][j] -= 1
        surplus -= 1
    return out


# -- the search -------------------------------------------------------------------------------


def candidate_mixes(cands: Sequence[Candidate]) -> Iterable[tuple[int, ...]]:
    """The mixes evaluated before the climb: all of them where there are at most EXHAUSTIVE;
    else every count of each type alone and every mix of 2..PRUNED_TYPES types whose counts
    are on GRID (or a type's whole availability)."""
    k = len(cands)
    if math.prod(c.available + 1 for c in cands) <= EXHAUSTIVE:
        yield from itertools.product(*(range(c.available + 1) for c in cands))
        return
    for i, c in enumerate(cands):
        for n in range(1, c.available + 1):
            yield tuple(n if j == i else 0 for j in range(k))
    grids = [sorted({n for n in GRID if n <= c.available} | {c.available}) for c in cands]
    for r in range(2, min(PRUNED_TYPES, k) + 1):
        for idx in itertools.combinations(range(k), r):
            for ns in itertools.product(*(grids[i] for i in idx)):
                counts = [0] * k
                for i, n in zip(idx, ns, strict=True):
                    counts[i] = n
                yield tuple(counts)


def climb(evaluate: Evaluator, start: Prediction, key) -> Prediction:
    """From `start`, one instance more or less of one type at a time while `key` improves."""
    best, improved = start, True
    while improved:
        improved = False
        for i, d in itertools.product(range(len(best.counts)), (-1, 1)):
            counts = list(best.counts)
            counts[i] += d
            p = evaluate(counts)
            if p is not None and key(p) < key(best):
                best, improved = p, True
    return best


@dataclass(frozen=True)
class Ranking:
    """The chosen mix, every mix evaluated in the objective's order, the best of each type
    alone (by candidate), the Pareto front of time and cost, and how many mixes were priced,
    in the `markets` searched, with the `restart` an interruption costs on spot."""

    objective: Objective
    cands: list[Candidate]
    job: Job
    best: Prediction
    ranked: list[Prediction]
    singles: dict[str, Prediction]
    front: list[Prediction]
    evaluated: int
    markets: tuple[str, ...] = ("on-demand",)
    restart: Restart = DEFAULT_RESTART

    def mixing_helps(self) -> bool:
        return self.best.types() > 1


def check_budget(cands: Sequence[Candidate], budget_usd: float, markets=("on-demand",)) -> None:
    """A budget below one hour of the cheapest candidate instance (in `markets`) is refused,
    in one line."""

    def hourly(c: Candidate) -> float:
        spot = [c.spot_usd_per_hour] if "spot" in markets else []
        return min([*spot, *([c.usd_per_hour] if "on-demand" in markets else [])])

    cheapest = min(cands, key=hourly)
    if budget_usd < hourly(cheapest):
        raise RecommendError(
            f"--budget: ${budget_usd:g} is less than one instance-hour of the cheapest "
            f"candidate, {cheapest.instance_type} (${hourly(cheapest):g}/h); raise it or "
            "add a cheaper type"
        )


def _infeasible(objective: Objective, preds: list[Prediction], cands, job: Job) -> RecommendError:
    if objective.kind == "deadline":
        p = min(preds, key=by_hours)
        bare = min(preds, key=lambda p: p.bare_hours)
        only = (
            f"; {bare.label(cands)} would without interruptions ({bare.bare_hours:.3g} h)"
            if bare.bare_hours <= objective.planned_h
            else ""
        )
        return RecommendError(
            f"--deadline-h: no mix of the candidates finishes {job.steps} steps in "
            f"{objective.planned_h:.3g} h ({objective.deadline_h:g} h less a "
            f"{objective.margin:.0%} margin): the fastest, {p.label(cands)}, is predicted "
            f"{p.hours:.3g} h (${p.cost_usd:,.2f}){only}; allow more time, or more or faster "
            "instances"
        )
    p = min(preds, key=by_cost)
    return RecommendError(
        f"--budget: no mix of the candidates finishes {job.steps} steps within "
        f"${objective.budget_usd:g}: the cheapest, {p.label(cands)}, is predicted "
        f"${p.cost_usd:,.2f} ({p.hours:.3g} h); raise the budget or train fewer steps"
    )


def search(
    cands: Sequence[Candidate],
    job: Job,
    objective: Objective,
    markets: Sequence[str] = ("on-demand",),
    restart: Restart = DEFAULT_RESTART,
) -> Ranking:
    """The mix of `cands` in one of `markets` that is best for `objective` under the model
    (module docstring); a RecommendError when none is feasible, naming the fastest (deadline)
    or cheapest (budget) mix and its prediction."""
    cands, markets = list(cands), tuple(markets)
    if objective.kind == "budget":
        check_budget(cands, objective.budget_usd, markets)
    evs = [Evaluator(cands, job, m, restart) for m in markets]
    for ev in evs:
        for counts in candidate_mixes(cands):
            ev(counts)
        for key in (objective.key, by_hours, by_cost):
            for start in sorted(ev.predictions(), key=key)[:CLIMB_FROM]:
                climb(ev, start, key)
    preds = [p for ev in evs for p in ev.predictions()]
    if not preds:
        raise RecommendError(
            f"--global-batch: no mix of the candidates takes {job.global_batch} samples a step: "
            "fewer than the GPUs of any one instance, or more than all of them hold at "
            "--max-local-batch or their memory caps (the most per GPU: "
            + ", ".join(f"{c.instance_type} {len(c.step_s)}" for c in cands)
            + ")"
        )
    ranked = sorted(preds, key=objective.key)
    if not objective.feasible(ranked[0]):
        raise _infeasible(objective, preds, cands, job)
    singles = {}
    for i, c in enumerate(cands):
        alone = [p for p in ranked if p.counts[i] and p.types() == 1]
        if alone:
            singles[c.instance_type] = alone[0]
    priced = sum(ev.priced() for ev in evs)
    return Ranking(
        objective, cands, job, ranked[0], ranked, singles, pareto(preds), priced, markets, restart
    )
