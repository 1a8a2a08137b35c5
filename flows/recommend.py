"""Flow: which instances to rent for a job (`hetflow recommend` as a Prefect flow).

Its parameters are typed forms: the job (`RecommendJob`), the candidate instance types with how
many of each can be had (`RentableType`), the objective (`RecommendObjective`), where MLflow
is (`TrackingConfig`), the market (`RecommendMarket`: on-demand, spot or both, the spot
table and per-type overrides, what an interruption costs) and the profile history whose
measured curves it reads (`ProfileHistory`): together one `RecommendRequest`, the record
`hetflow recommend`'s flags make. It runs the command's pipeline on it
(`hetflow.tasks.recommend.recommend_mix`: `hetflow.forecast.rent.recommend.recommend` on the market
and history read there), records an MLflow run (the chosen mix's predicted time and cost,
on spot expected with its interruptions, as metrics; the table, the figures, the cluster file,
the Ray launcher's YAML and the plot of cost against time with its Pareto front as
artifacts), makes the same table the flow run's Prefect markdown artifact, and returns the
cluster file's text, which `hetflow demo --cluster` takes as is, and the Ray launcher's YAML,
which `ray up` does. Bad input fails the flow with the command's one line.
"""

from __future__ import annotations

from typing import Annotated

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from hetflow.config import (
    FormChoices,
    ProfileHistory,
    RecommendJob,
    RecommendMarket,
    RecommendObjective,
    RecommendRequest,
    RentableType,
    TrackingConfig,
    default_rentable,
    validated,
)
from hetflow.flows.forms import by_size
from hetflow.infra.tracking.tracker import MLflowTracker
from hetflow.tasks.recommend import form_choices, recommend_mix, record_recommendation

MODELS, RENTABLE = form_choices()
Job = Annotated[RecommendJob, FormChoices("recipe", MODELS)]
Rentable = Annotated[RentableType, FormChoices("instance_type", sorted(RENTABLE, key=by_size))]


@flow(name="recommend", log_prints=True)
def recommend(
    job: Job = RecommendJob(),
    candidates: list[Rentable] = default_rentable(),
    objective: RecommendObjective = RecommendObjective(),
    tracking: TrackingConfig = TrackingConfig(),
    market: RecommendMarket = RecommendMarket(),
    history: ProfileHistory = ProfileHistory(),
) -> dict:
    """The mix of `candidates` that is best for `objective` on `job` (docs/recommend.md).

    Returns {"cluster_file": its text, "ray_config": the Ray cluster launcher's YAML for AWS
    (`ray up` it), "mix": {type: instances}, "predicted_hours",
    "predicted_cost_usd", "mlflow_run_id", "mlflow_url"}.
    """
    request = validated(
        RecommendRequest,
        {
            "job": job,
            "candidates": candidates,
            "objective": objective,
            "market": market,
            "history": history,
        },
        "request",
    )
    out = recommend_mix(request)
    run_id = record_recommendation(out, request, tracking)
    tracker = MLflowTracker(tracking)
    links = tracker.links_markdown({"recommend": run_id})
    cluster_yaml = out.rec.cluster_yaml()
    create_markdown_artifact(
        out.rec.markdown() + "\n" + links + "\n\n```yaml\n" + cluster_yaml + "```\n",
        key="recommendation",
        description="the chosen mix and the best alternatives",
    )
    print(out.rec.summary())
    return {
        "cluster_file": cluster_yaml,
        "ray_config": out.ray_yaml,
        "mix": out.mix,
        "predicted_hours": out.hours,
        "predicted_cost_usd": out.cost_usd,
        "mlflow_run_id": run_id,
        "mlflow_url": tracker.run_url(run_id),
    }
