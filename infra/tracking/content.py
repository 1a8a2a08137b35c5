"""What hetflow's MLflow runs hold: a trained variant's figures, series, JSON and plots, and a
comparison's parent run. Written through a `MLflowTracker`, by the driver, after training."""

from __future__ import annotations

import json
from collections.abc import Mapping

from hetflow.config import ClusterSpec
from hetflow.infra.report import plots
from hetflow.infra.report import table as report
from hetflow.infra.tracking.tracker import NOTE, MLflowTracker
from hetflow.records import CompressionTrials, EvalPoint, Profile, TrainOutcome


def record_training(
    tracker: MLflowTracker,
    outcome: TrainOutcome,
    profile: Profile,
    cluster: ClusterSpec | None = None,
) -> None:
    """A trained variant's figures (at the final step: per-rank names double as per-step
    series, and MLflow shows a metric's value at its highest step), per-step series, the
    evaluations (`test_accuracy`, or `val_loss` and `perplexity`), the profile and plan
    history as JSON, a tag `profile_source.<worker>` per worker (the profile's `sources`:
    measured now, or the history entry reused and its age), the regroups in place of a run
    under `faults.on_loss: continue` (`membership.json`, the series `membership.world` at the
    step each took effect), and its plots (ranks labelled by the cluster's workers, if given).
    Leaves the run open."""
    rid, lead = outcome.run_id, outcome.result.lead
    tracker.log_metrics(rid, outcome.metrics.flat(), step=outcome.metrics.steps)
    tracker.log_series(
        rid,
        [
            *(row.flat() for row in outcome.series),
            *({"step": e.step, **_eval_series(e)} for e in lead.evals),
        ],
    )
    reason = lead.trials.reason if lead.trials else outcome.plan.compression_reason
    tracker.client.set_tag(rid, "compression_reason", reason)
    if lead.recovery.left_out:  # workers the run went on without (a lost node: ray_launch)
        tracker.log_params(rid, {"recovery.left_out": json.dumps(lead.recovery.left_out)})
    record_membership(tracker, rid, lead.recovery.membership)
    if lead.trials is not None:
        record_trials(tracker, rid, lead.trials)
    tracker.log_json(rid, "profile.json", profile)
    for r, source in zip(profile.ranks, profile.sources, strict=False):  # none: before history
        tracker.client.set_tag(rid, f"profile_source.{r.worker or r.rank}", source)
    tracker.log_json(
        rid,
        "plan.json",
        {
            "initial": outcome.plan.model_dump(mode="json"),
            "plans": [p.model_dump(mode="json") for p in lead.plans],
            "replans": lead.replans,
        },
    )
    title = outcome.variant
    labels = plots.rank_labels(cluster, profile) if cluster else None
    rows, row_labels = plots.rank_rows(outcome.result, cluster, profile)
    tracker.log_plots(
        rid,
        {
            "timeline.png": lambda p: plots.timeline(
                rows, p, title=f"{title}: per-rank timeline", labels=row_labels
            ),
            "steps.png": lambda p: plots.step_series(
                outcome.series, p, title=f"{title}: step time and plan", labels=labels
            ),
        },
    )


def record_membership(tracker: MLflowTracker, run_id: str, changes: list) -> None:
    """The regroups in place of a run under `faults.on_loss: continue` (`MembershipChange`s):
    the artifact `membership.json`, and the series `membership.world` at the step each took
    effect; nothing where there were none."""
    if not changes:
        return
    tracker.log_json(run_id, "membership.json", [c.model_dump(mode="json") for c in changes])
    for c in changes:
        tracker.log_metrics(run_id, {"membership.world": c.world}, step=c.step)


def record_trials(tracker: MLflowTracker, run_id: str, trials: CompressionTrials) -> None:
    """'auto''s compression trials: the table as the MLflow table `compression_trials.json`
    (one row per candidate, in the order tried: `method`, `step_ms` (empty: failed),
    `bytes_per_step`, `error`, `chosen`), and the params `compression.chosen` and
    `compression.chosen_reason`."""
    rows = trials.trials
    table = {
        "method": [str(t.method) for t in rows],
        "step_ms": [None if t.step_s is None else t.step_s * 1e3 for t in rows],
        "bytes_per_step": [t.bytes_per_step for t in rows],
        "error": [t.error for t in rows],
        "chosen": [t.method == trials.chosen for t in rows],
    }
    tracker.client.log_table(run_id, data=table, artifact_file="compression_trials.json")
    tracker.log_params(
        run_id,
        {"compression.chosen": str(trials.chosen), "compression.chosen_reason": trials.reason},
    )


def finish_comparison(
    tracker: MLflowTracker,
    run_id: str,
    outcomes: Mapping[str, TrainOutcome],
    table: dict,
    markdown: str,
    labels: list[str] | None = None,
    launched_labels: Mapping[str, list[str]] | None = None,
) -> None:
    """The comparison's figures (`report.headline`: `baseline/NAME`, `optimized/NAME`,
    `speedup`, ...), `markdown` as the run's description and `comparison.md`, the table as
    `comparison.json`, and the plots of both variants (`side_by_side.png`, the ranks each
    variant launched labelled `launched_labels`, else `labels`; `busy_fraction.png`, the
    cluster's ranks labelled `labels`; `rate.png`, each variant's samples/s against steps);
    then FINISHED."""
    baseline, optimized = (outcomes[v].metrics.flat() for v in ("baseline", "optimized"))
    tracker.log_metrics(run_id, report.headline(baseline, optimized))
    tracker.client.set_tag(run_id, NOTE, markdown)
    tracker.log_json(run_id, "comparison.json", table)
    tracker.log_text(run_id, "comparison.md", markdown)
    records = {
        v: [r.records for r in sorted(o.result.ranks, key=lambda r: r.rank)]
        for v, o in outcomes.items()
    }
    tracker.log_plots(
        run_id,
        {
            "side_by_side.png": lambda p: plots.side_by_side(records, p, launched_labels or labels),
            "busy_fraction.png": lambda p: plots.busy_comparison(baseline, optimized, p, labels),
            "rate.png": lambda p: plots.rate_curves(
                {
                    v: plots.rolling_rate([x.step_s for x in recs[0]], plots.step_samples(recs))
                    for v, recs in records.items()
                },
                p,
            ),
        },
    )
    tracker.finish(run_id)


def _eval_series(e: EvalPoint) -> dict[str, float]:
    """An evaluation's figures as per-step series: accuracy as `test_accuracy`."""
    return {("test_accuracy" if k == "accuracy" else k): v for k, v in e.figures().items()}
