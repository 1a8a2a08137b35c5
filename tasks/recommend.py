"""Recommend tasks: which instances to rent (the search of `hetflow recommend`,
`hetflow.forecast.search`) and its MLflow run.

The flow gets back a `Recommended`: the search's result and everything shown of it, as text
(the markdown table, the cluster file), so that it needs nothing of the plan layer itself.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from prefect import task
from prefect.cache_policies import NO_CACHE

from hetflow.config import (
    ClusterSpec,
    ProfileHistory,
    RecommendJob,
    RecommendMarket,
    RecommendObjective,
    RentableType,
    TrackingConfig,
)
from hetflow.forecast import rental
from hetflow.forecast.search import Job, Objective, local_batches, search
from hetflow.forecast.spot_table import market_setup
from hetflow.infra.market import load_market
from hetflow.infra.ray_cluster import ray_yaml
from hetflow.infra.tracking.plots import cost_time_front
from hetflow.infra.tracking.tracker import MLflowTracker


@dataclass(frozen=True)
class Recommended:
    """The chosen mix, its local batches, and what the command would print and write."""

    rec: object = field(repr=False)  # a forecast.search.Recommendation
    batches: list[list[int]]
    seconds: float
    mix: dict[str, int]
    hours: float
    cost_usd: float
    summary: str  # 'chosen: MIX: predicted H h, $C (...)'
    markdown: str = field(repr=False)
    cluster_yaml: str = field(repr=False)
    ray_yaml: str = field(repr=False)  # the Ray cluster launcher's config for AWS
    figures: dict = field(repr=False)

    def draw(self, path) -> None:
        """The plot of cost against time, the Pareto front marked (`rental.plot_front`)."""
        cost_time_front(path, **rental.front(self.rec))


def form_choices() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(The models `recommend` knows, the instance types of the offline catalog it can time
    and price): what the flow's form lists."""
    job = Job(rental.model_of("resnet50"), global_batch=1, steps=1)
    market = load_market()
    types = []
    for name in market.types:
        try:
            rental.candidates([(name, 1)], job, market)
        except rental.RecommendError:  # no price, or no published step-time curve
            continue
        types.append(name)
    return rental.NAMES, tuple(types)


def market_of(market: RecommendMarket, names: list[str]):
    """(Markets, Restart, SpotTable or None) of the form, checked as the command's flags are."""
    over = market.overrides
    return market_setup(
        market.kind,
        names,
        load_market(market.kind != "on-demand", market.spot_table),
        market.spot_table,
        {o.instance_type: o.discount for o in over if o.discount is not None},
        {
            o.instance_type: o.interruptions_per_month
            for o in over
            if o.interruptions_per_month is not None
        },
        market.restart_s,
        market.checkpoint_every,
    )


@task(task_run_name="recommend ({objective.kind}, {market.kind})", retries=0, cache_policy=NO_CACHE)
def recommend_mix(
    job: RecommendJob,
    candidates: list[RentableType],
    objective: RecommendObjective,
    market: RecommendMarket,
    history: ProfileHistory | None = None,
) -> Recommended:
    """The search for `objective` over `candidates` in `market`, as `hetflow recommend` runs
    it; the same one-line RecommendError on bad input (an unknown type, a deadline or budget no
    mix meets, a bad spot figure)."""
    spec = Job(rental.model_of(job.recipe), global_batch=job.global_batch, steps=job.steps)
    goal = Objective(
        objective.kind, objective.deadline_h, objective.budget_usd, objective.deadline_margin
    )
    mix = [(c.instance_type, c.count) for c in candidates]
    markets, restart, spot = market_of(market, [name for name, _ in mix])
    measured = None
    if history is not None and history.url:
        from hetflow.tasks.history import read_type_history

        names = [name for name, _ in mix]
        measured = read_type_history(history.url.rstrip("/"), names, job.recipe, history.max_age_h)
    cands = rental.candidates(mix, spec, load_market(), job.max_local_batch, spot, measured)
    t = time.perf_counter()
    rec = search(cands, spec, goal, markets, restart)
    batches = local_batches(cands, rec.best, spec.global_batch)
    seconds = time.perf_counter() - t
    figures = rental.figures(rec, batches, seconds, spot)
    return Recommended(
        rec,
        batches,
        seconds,
        figures["chosen"]["mix"],
        rec.best.hours,
        rec.best.cost_usd,
        rental.chosen_line(rec),
        rental.markdown(rec, batches, measured),
        rental.cluster_yaml(rec, batches),
        ray_yaml(ClusterSpec.model_validate(rental.cluster_file(rec))),
        figures,
    )


@task(task_run_name="record the recommendation in MLflow", cache_policy=NO_CACHE)
def record_recommendation(
    out: Recommended,
    job: RecommendJob,
    objective: RecommendObjective,
    tracking: TrackingConfig,
    market: RecommendMarket,
) -> str:
    """An MLflow run named 'recommend': the job, objective and market as params, the chosen
    mix's predicted (on spot: expected) time and cost, its expected interruptions and time
    without them as metrics, the table (markdown), the figures (JSON), the cluster file and
    the plot of cost against time as artifacts. Its id."""
    tracker = MLflowTracker(tracking)
    tags = {"variant": "recommend", "recipe": job.recipe, **tracker.flow_run_tags()}
    run = tracker.client.create_run(tracker.experiment_id(), run_name="recommend", tags=tags)
    run_id = run.info.run_id
    try:
        params = {f"job.{k}": str(v) for k, v in job.model_dump().items()}
        params |= {f"objective.{k}": str(v) for k, v in objective.model_dump().items()}
        params |= market_params(market, out.figures["market"])
        params["chosen.mix"] = ", ".join(f"{t} x{n}" for t, n in out.mix.items())
        params["chosen.market"] = out.figures["chosen"]["market"]
        tracker.log_params(run_id, params)
        chosen = out.figures["chosen"]
        tracker.log_metrics(
            run_id,
            {
                "predicted_hours": out.hours,
                "predicted_cost_usd": out.cost_usd,
                "predicted_step_s": chosen["step_s"],
                "usd_per_hour": chosen["usd_per_hour"],
                "instances": sum(out.mix.values()),
                "mixes_priced": out.figures["mixes_priced"],
                "expected_interruptions": chosen["interruptions"],
                "predicted_hours_uninterrupted": chosen["hours_uninterrupted"],
            },
        )
        tracker.log_text(run_id, "recommendation.md", out.markdown)
        tracker.log_json(run_id, "recommendation.json", out.figures)
        tracker.log_text(run_id, "recommended-cluster.yaml", out.cluster_yaml)
        tracker.log_text(run_id, "recommended-ray.yaml", out.ray_yaml)
        tracker.log_plots(run_id, {"cost_vs_time.png": out.draw})
    except Exception as e:
        tracker.fail(run_id, str(e))
        raise
    tracker.finish(run_id)
    return run_id


def market_params(market: RecommendMarket, searched: dict) -> dict[str, str]:
    """The market searched and, with spot, what an interruption costs and the table's source."""
    out = {"market.kind": market.kind}
    if market.kind != "on-demand":
        out["market.restart_s"] = str(searched["restart_s"])
        out["market.checkpoint_every"] = str(searched["checkpoint_every"])
        table = searched["spot_table"]
        out["market.spot_table"] = f"{table['source']}, as of {table['as_of']}"[:500]
    return out
