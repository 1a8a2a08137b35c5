"""Recommend tasks: which instances to rent (the one pipeline of `hetflow recommend`,
`hetflow.forecast.rent.recommend.recommend`, on the market and history read here) and its
MLflow run.

The flow gets back a `Recommended`: the recommendation and the Ray launcher's YAML of its
cluster file, so that it needs nothing of the forecast room itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prefect import task
from prefect.cache_policies import NO_CACHE

from hetflow.config import (
    RecommendMarket,
    RecommendRequest,
    TrackingConfig,
)
from hetflow.forecast.rent import rental
from hetflow.forecast.rent.recommend import Recommendation, recommend
from hetflow.forecast.rent.search import Job
from hetflow.forecast.rent.table import front
from hetflow.infra.market import load_market
from hetflow.infra.ray_cluster import ray_yaml
from hetflow.infra.report.plots import cost_time_front
from hetflow.infra.tracking.tracker import MLflowTracker
from hetflow.tasks.history import request_history


@dataclass(frozen=True)
class Recommended:
    """The recommendation, and the Ray cluster launcher's config for AWS of its choice."""

    rec: Recommendation = field(repr=False)
    ray_yaml: str = field(repr=False)

    @property
    def mix(self) -> dict[str, int]:
        return self.rec.mix

    @property
    def hours(self) -> float:
        return self.rec.best.hours

    @property
    def cost_usd(self) -> float:
        return self.rec.best.cost_usd

    def draw(self, path) -> None:
        """The plot of cost against time, the Pareto front marked."""
        cost_time_front(path, **front(self.rec.ranking))


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


@task(
    task_run_name="recommend ({request.objective.kind}, {request.market.kind})",
    retries=0,
    cache_policy=NO_CACHE,
)
def recommend_mix(request: RecommendRequest) -> Recommended:
    """The recommendation `hetflow recommend` makes of the same request (the market and the
    history read, then `rent.recommend.recommend`); the same one-line RecommendError on
    bad input (an unknown type, a deadline or budget no mix meets, a bad spot figure)."""
    rec = recommend(request, request_history(request), load_market(request.market))
    return Recommended(rec, ray_yaml(rec.cluster()))


@task(task_run_name="record the recommendation in MLflow", cache_policy=NO_CACHE)
def record_recommendation(
    out: Recommended, request: RecommendRequest, tracking: TrackingConfig
) -> str:
    """An MLflow run named 'recommend': the request's job, objective and market as params, the
    chosen mix's predicted (on spot: expected) time and cost, its expected interruptions and time
    without them as metrics, the table (markdown), the figures (JSON), the cluster file and
    the plot of cost against time as artifacts. Its id."""
    job, objective, market = request.job, request.objective, request.market
    tracker = MLflowTracker(tracking)
    tags = {"variant": "recommend", "recipe": job.recipe, **tracker.flow_run_tags()}
    run = tracker.client.create_run(tracker.experiment_id(), run_name="recommend", tags=tags)
    run_id = run.info.run_id
    try:
        params = {f"job.{k}": str(v) for k, v in job.model_dump().items()}
        params |= {f"objective.{k}": str(v) for k, v in objective.model_dump().items()}
        figures = out.rec.figures()
        params |= market_params(market, figures["market"])
        params["chosen.mix"] = ", ".join(f"{t} x{n}" for t, n in out.mix.items())
        params["chosen.market"] = figures["chosen"]["market"]
        tracker.log_params(run_id, params)
        chosen = figures["chosen"]
        tracker.log_metrics(
            run_id,
            {
                "predicted_hours": out.hours,
                "predicted_cost_usd": out.cost_usd,
                "predicted_step_s": chosen["step_s"],
                "usd_per_hour": chosen["usd_per_hour"],
                "instances": sum(out.mix.values()),
                "mixes_priced": figures["mixes_priced"],
                "expected_interruptions": chosen["interruptions"],
                "predicted_hours_uninterrupted": chosen["hours_uninterrupted"],
            },
        )
        tracker.log_text(run_id, "recommendation.md", out.rec.markdown())
        tracker.log_json(run_id, "recommendation.json", figures)
        tracker.log_text(run_id, "recommended-cluster.yaml", out.rec.cluster_yaml())
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
