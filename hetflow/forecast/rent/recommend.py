"""The one recommend pipeline: a `RecommendRequest` (what `hetflow recommend`'s flags and the
`recommend` flow's form ask), the profile history and the rental market in; a
`Recommendation` out: the mix to rent and its batch plan, what is shown of it, and the cluster
file that launches it. The command and the flow call `recommend` and differ only in where they
put its output (a terminal and files; a Prefect artifact and an MLflow run).

Pure: the caller reads the market (`hetflow.infra.market.load_market`) and the history
(`hetflow.tasks.history.read_type_history`) and passes them in.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from hetflow.config import ClusterSpec, RecommendRequest
from hetflow.forecast.rent import table
from hetflow.forecast.rent.objective import Objective
from hetflow.forecast.rent.rental import History, candidates, model_of
from hetflow.forecast.rent.search import Prediction, Ranking, local_batches, search
from hetflow.forecast.rent.spot_table import market_setup
from hetflow.forecast.simulate.job import Job


@dataclass(frozen=True)
class Recommendation:
    """The search's ranking of mixes, the chosen mix's local batches (per candidate, device by
    device), the prices, spot table and history it was made from, how long the search took,
    and the notes on what the prediction could not check."""

    ranking: Ranking
    batches: list[list[int]]
    price_source: str  # the On-Demand price table's source and date
    spot: object | None = field(default=None, repr=False)  # the SpotTable used, if spot
    history: History | None = field(default=None, repr=False)
    seconds: float = 0.0
    notes: tuple[str, ...] = ()
    precision: str = "mixed"  # the job's, which its memory caps assume

    @property
    def best(self) -> Prediction:
        return self.ranking.best

    @property
    def mix(self) -> dict[str, int]:
        """The chosen instances per type."""
        cands = self.ranking.cands
        return {c.instance_type: n for c, n in zip(cands, self.best.counts, strict=True) if n}

    def summary(self) -> str:
        """'chosen: MIX: predicted H h, $C (...)'."""
        return table.chosen_line(self.ranking)

    def all_notes(self) -> list[str]:
        """Where the prediction leaves what was published, measured or checked."""
        return [*self.notes, *table.outside(self.ranking, self.batches)]

    def markdown(self) -> str:
        """The choice, its notes and the table (the flow's artifact; the command prints it)."""
        return table.markdown(self.ranking, self.batches, self.history, self.all_notes())

    def figures(self) -> dict:
        """The choice, the alternatives and the front as JSON figures."""
        out = table.figures(self.ranking, self.batches, self.seconds, self.spot)
        out["job"]["precision"] = self.precision
        return out

    def cluster_file(self) -> dict:
        """The chosen mix as a ClusterSpec mapping (`cluster_file`)."""
        return cluster_file(self.ranking)

    def cluster(self) -> ClusterSpec:
        return ClusterSpec.model_validate(self.cluster_file())

    def cluster_yaml(self) -> str:
        """The cluster file's text, with the plan and the prediction as comments."""
        import yaml

        rec, plan = self.ranking, self.batches
        self.cluster()  # checked
        batches = "; ".join(
            f"{c.instance_type}: {bs}" for c, bs in zip(rec.cands, plan, strict=True) if bs
        )
        head = (
            f"# hetflow recommend: {rec.best.label(rec.cands)}, predicted "
            f"{rec.best.hours:.3g} h, ${rec.best.cost_usd:,.2f}\n"
            f"# local batches (global {rec.job.global_batch}): {batches}\n"
        )
        return head + yaml.safe_dump(self.cluster_file(), sort_keys=False)


def job_of(request: RecommendRequest) -> Job:
    """The forecast's Job of the request's (the model's figures, the batch, the steps)."""
    j = request.job
    return Job(model_of(j.recipe), global_batch=j.global_batch, steps=j.steps)


def objective_of(request: RecommendRequest) -> Objective:
    o = request.objective
    return Objective(o.kind, o.deadline_h, o.budget_usd, o.deadline_margin)


def recommend(request: RecommendRequest, history: History | None, market) -> Recommendation:
    """The mix of the request's candidates best for its objective, on `market` (the offline
    catalog's types, their prices and, when spot is searched, the spot table:
    `hetflow.infra.market.RentalMarket`), with the measured curves of `history` where it has
    them. A RecommendError (one line) for what the request's models cannot know alone: a type
    the catalog lacks or cannot time, spot figures of a type not in the table, a deadline or
    budget no mix meets."""
    job, m = job_of(request), request.market
    mix = [(c.instance_type, c.count) for c in request.candidates]
    discounts = {o.instance_type: o.discount for o in m.overrides if o.discount is not None}
    per_month = {
        o.instance_type: o.interruptions_per_month
        for o in m.overrides
        if o.interruptions_per_month is not None
    }
    markets, restart, spot = market_setup(
        m.kind, request.names, market, discounts, per_month, m.restart_s, m.checkpoint_every
    )
    j = request.job
    cands = candidates(mix, job, market, j.max_local_batch, spot, history, j.precision)
    t = time.perf_counter()
    ranking = search(cands, job, objective_of(request), markets, restart)
    batches = local_batches(cands, ranking.best, job.global_batch)
    seconds = time.perf_counter() - t
    source = f"{market.prices.source}, as of {market.prices.as_of}"
    notes = memory_notes(ranking, batches)
    return Recommendation(ranking, batches, source, spot, history, seconds, notes, j.precision)


def memory_notes(ranking: Ranking, batches: list[list[int]]) -> tuple[str, ...]:
    """For each type the choice rents: its local batches capped by memory and why, or that its
    memory was not checked and why."""
    notes = []
    for c, bs in zip(ranking.cands, batches, strict=True):
        if bs and c.memory is not None and (note := c.memory.note(c.instance_type, max(bs))):
            notes.append(note)
    return tuple(notes)


def cluster_file(rec: Ranking) -> dict:
    """The chosen mix as a ClusterSpec mapping: the market it is rented in, one worker per GPU,
    named and noded by its instance, with its instance type and the preset that emulates it
    (`hetflow demo --cluster` takes it as is; `hetflow cluster config` makes its Ray launcher
    YAML, spot nodes for a spot mix). Where a type has no
    preset (its curve was measured), every worker also gets `speed`: its curve's best samples/s
    over the fastest's (a preset worker's curve keeps its shape, the speeds their ratio)."""
    chosen = [(c, n) for c, n in zip(rec.cands, rec.best.counts, strict=True) if n]
    speeds = None
    if any(c.preset is None for c, _ in chosen):
        rate = {c.instance_type: max(b / s for b, s in enumerate(c.step_s, 1)) for c, _ in chosen}
        top = max(rate.values())
        speeds = {name: round(r / top, 4) for name, r in rate.items()}
    workers = []
    for c, n in chosen:
        stem = c.instance_type.replace(".", "-")
        for i in range(n):
            for g in range(c.devices):
                name = f"{stem}-{i}" + (f"-gpu{g}" if c.devices > 1 else "")
                worker = {"name": name, "instance_type": c.instance_type}
                worker |= {"preset": c.preset} if c.preset else {}
                worker |= {"speed": speeds[c.instance_type]} if speeds else {}
                workers.append(worker | {"node": f"{stem}-{i}"})
    return {"name": "recommended", "market": rec.best.market, "workers": workers}
