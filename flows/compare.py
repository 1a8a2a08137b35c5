"""Flow: baseline and optimized on the same cluster, data and seed, side by side.

Both variants are children of one MLflow parent run, which holds the job as params, both
variants' headline figures and their ratios as metrics, the comparison table (with its notes:
the workers a variant ran without, why communication grew) as its description, and the plots
of both on one time axis. The same table, with links to the three MLflow runs, is the flow
run's Prefect markdown artifact.

The variants run in the order `repeats.run_order` gives for round `train.seed`: an even seed
runs the baseline first, an odd one the optimized variant, so that repeats over seeds 0..N
alternate which launch finds the host warm; a note under the table says which ran first.
"""

from __future__ import annotations

from prefect import flow
from prefect.artifacts import create_markdown_artifact
from pydantic.json_schema import SkipJsonSchema

from hetflow.config import (
    DatasetSpec,
    TrackingConfig,
    TrainConfig,
    default_cluster,
)
from hetflow.flows.forms import Cluster, Compared, Dataset
from hetflow.infra.report.notes import notes, workers_left
from hetflow.infra.report.plots import rank_labels
from hetflow.infra.report.table import (
    comparison,
    headline,
    launch_phases,
    markdown,
    summary,
)
from hetflow.infra.report.verdict import verdict
from hetflow.infra.tracking.content import finish_comparison
from hetflow.infra.tracking.tracker import MLflowTracker
from hetflow.repeats import run_order
from hetflow.tasks.history import MEASURED_NOW, prior_note, profile_for
from hetflow.tasks.opening import Reached, ResolvedJob, opened
from hetflow.tasks.train import launched_labels, train_task, warm_agents

VARIANTS = ("baseline", "optimized")


def table_and_notes(outcomes: dict, train: TrainConfig) -> tuple[dict, list[str]]:
    """The side-by-side table of the variants' `outcomes` (start plans, the target) and the
    notes under it (the workers each went without, why communication grew)."""
    baseline, optimized = (outcomes[v].metrics.flat() for v in VARIANTS)
    table = comparison(
        baseline,
        optimized,
        start_batches={v: o.plan.local_batches for v, o in outcomes.items()},
        target_accuracy=train.target_accuracy,
        target_val_loss=train.target_val_loss,
    )
    left = {
        v: workers_left(o.plan.excluded, o.plan.dropped, o.result.lead.recovery.left_out)
        for v, o in outcomes.items()
    }
    return table, notes(baseline, optimized, left)


def report(outcomes: dict, table: dict, said: list[str], title: str, links: str) -> tuple[str, str]:
    """(who won, in one sentence: `verdict`; the table as markdown under it, with the summary
    of the ratios, the `said` notes and the runs' `links`)."""
    baseline, optimized = (outcomes[v].metrics.flat() for v in VARIANTS)
    lead = verdict(baseline, optimized)
    before = " ".join(filter(None, [lead, summary(headline(baseline, optimized))]))
    return lead, markdown(table, title, before=before, after=links, notes=said)


def order_note(order: list[str]) -> str:
    """Which variant ran first: the launch after another can find the host warmer."""
    return (
        f"{order[0]} ran first, then {order[1]}: an even --seed runs the baseline first, "
        "an odd one the optimized variant (repeat over seeds to alternate them)."
    )


def reuse_note(profile) -> list[str]:
    """A note where the profile was reused from the history, in part or whole: the optimized
    run's end-to-end figures then charge it only what this run measured (`profiling_time_s`),
    the rest having been paid by the run that measured it. Where the plan started from a prior,
    what it was: nothing was profiled before the first step."""
    if profile.prior:
        return prior_note(profile)
    reused = [
        f"{r.worker} ({src})"
        for r, src in zip(profile.ranks, profile.sources, strict=False)
        if not src.startswith(MEASURED_NOW)
    ]
    if not reused:
        return []
    return [
        f"the profile of {len(reused)} of {len(profile.ranks)} workers was reused from the "
        f"profile history, not measured in this run: the optimized run is charged "
        f"{profile.profiling_time_s:.1f} s of profiling, what this run measured "
        f"(`--profile-max-age-h 0` measures every worker): " + "; ".join(reused) + "."
    ]


def _recorded(outcomes, train, profile, order, cluster, tracker, parent):
    """The comparison's table and notes, its report as the `comparison` artifact and in the
    parent MLflow run: (table, notes, the verdict, the runs by label)."""
    table, said = table_and_notes(outcomes, train)
    said += [*reuse_note(profile), order_note(order)]
    runs = {"compare": parent, **{v: outcomes[v].run_id for v in VARIANTS}}
    title = f"{cluster.name}: baseline vs optimized"
    said_first, md = report(outcomes, table, said, title, tracker.links_markdown(runs))
    create_markdown_artifact(md, key="comparison", description="baseline vs optimized")
    ran = {v: launched_labels(cluster, o, profile) for v, o in outcomes.items()}
    finish_comparison(tracker, parent, outcomes, table, md, rank_labels(cluster, profile), ran)
    return table, said, said_first, runs


@flow(name="compare", log_prints=True)
def compare(
    train: Compared = TrainConfig(),
    cluster: Cluster = default_cluster(),
    dataset: Dataset = DatasetSpec(),
    tracking: SkipJsonSchema[TrackingConfig] = TrackingConfig(),
    job: SkipJsonSchema[ResolvedJob | None] = None,
    reached: SkipJsonSchema[Reached | None] = None,
) -> dict:
    """Baseline and optimized runs of `train` on `cluster` and `dataset`, side by side; the
    table is the run's `comparison` artifact. `tracking` is left out of the form. `job` and
    `reached`: what the command that started the flow resolved and asked
    (`tasks.opening.opened`); none: the flow does both at its entry."""
    configs = train.compared()  # each variant's own knobs: 'auto' may try local SGD
    outcomes = {}
    order = run_order(VARIANTS, train.seed)
    with (
        warm_agents(cluster, 1 + len(order)) as agents,  # the profile's launch, each variant's
        opened(cluster, list(configs.values()), dataset, tracking, job, reached) as run,
    ):
        cluster, catalog = run.cluster, run.catalog
        profile = profile_for(cluster, dataset, train, list(configs.values()), catalog, run.job)
        if agents is not None:
            agents.expect(len(order))  # the profile's launch made, or its history reused
        tracker = MLflowTracker(tracking)
        parent = tracker.start_comparison(cluster, dataset, configs)
        for variant in order:
            try:
                outcomes[variant] = train_task(train.faults)(
                    variant,
                    cluster,
                    dataset,
                    run.job.resolved(configs[variant]),
                    profile,
                    tracking,
                    parent,
                    catalog=catalog,
                    epoch_samples=run.epoch_samples,
                    data=run.data,
                    job=run.job,
                )
            except Exception as e:
                tracker.fail(parent, f"{variant}: {e}")
                raise
    table, said, said_first, runs = _recorded(
        outcomes, train, profile, order, cluster, tracker, parent
    )
    return {
        "table": table,
        "verdict": said_first,
        "order": order,  # the order the variants ran in
        "notes": said,
        "parent_run_id": parent,
        "run_ids": {v: outcomes[v].run_id for v in VARIANTS},
        "mlflow_urls": {label: tracker.run_url(rid) for label, rid in runs.items()},
        "plans": {v: outcomes[v].plan.model_dump(mode="json") for v in VARIANTS},
        # each worker's launch by phase, per variant (`report.launch_phases`)
        "startup": {v: launch_phases(outcomes[v].metrics.flat()) for v in VARIANTS},
    }
