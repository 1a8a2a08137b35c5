"""From the ranks' step records to the run's figures (pure), under the one name each figure has in
MLflow, the docs and benchmark JSON (docs/metrics.md).

`throughput_samples_per_s` counts the steps' own times (rank 0's `step_s`);
`steady_samples_per_s` their wall clock, what happens between them included; `end_to_end`
adds what the variant paid before its first step (profile, launch, trials).

busy_fraction is compute time over training time, per rank (`rank{r}/busy_fraction`) and over
all ranks (`busy_fraction`); the rest is communication, waiting for the slowest rank (idle) and
waiting for data. `train_loop_s` is the training loop's time: the sum of rank 0's step times
(`step_records`: where the rank that wrote the result joined in place, the steps before its
join are those of the process that ran them).
"""

from __future__ import annotations

from hetflow.config import TrainConfig
from hetflow.figures import RankFigures, RunMetrics, StepFigures, StepRank
from hetflow.records import EvalPoint, RankResult, RunResult, StepRecord

THROUGHPUT_SKIP_STEPS = 1  # the first step includes DDP's bucket rebuild; throughput skips it


def summarize(
    result: RunResult,
    global_batch: int,
    target_accuracy: float | None = None,
    target_val_loss: float | None = None,
) -> RunMetrics:
    """The run's figures: throughput, time, bytes, where the ranks' time went, the recipe's
    evaluation (`final_accuracy` or `final_val_loss`, and `time_to_target_s`: the training
    time until the first evaluation that met the target of the figure the recipe evaluates),
    cache; each launched rank's `RankFigures`, numbered as launched (`RankMap.to_cluster`
    renumbers them as the cluster's workers)."""
    ranks = sorted(result.ranks, key=lambda r: r.rank)
    lead = result.lead  # the writer: under `on_loss: continue` a joiner may hold a lower rank
    records = step_records(result)  # every step, those before a joiner lead's join too
    steps = len(records)
    rounds = steps if any(rec.inner_steps for rec in records) else None
    if rounds:  # strategy 'diloco': a step is a round, of every rank's samples
        global_batch = sum(r.records[0].batch for r in ranks)
    step_times = [r.step_s for r in records]
    loop = sum(step_times)
    timed = step_times[THROUGHPUT_SKIP_STEPS:] or step_times
    bytes_total = sum(sum(rec.bytes_sent for rec in r.records) for r in ranks)
    per_rank = [_rank_figures(r) for r in ranks]
    # where the ranks' time went, over every rank's own steps: compute + comm + idle + data
    # wait = 1 (a rank's step is data + compute + wait, its wait idle + comm). Rank 0's loop
    # times the world is not that sum: on a loaded host the ranks' totals differ by a few %.
    ranks_s = sum(sum(rec.step_s for rec in r.records) for r in ranks) or 1.0
    hits = sum(r.cache.hits for r in ranks)
    misses = sum(r.cache.misses for r in ranks)
    return RunMetrics(
        throughput_samples_per_s=global_batch * len(timed) / sum(timed),
        train_loop_s=loop,
        comm_bytes_total=bytes_total,
        comm_bytes_per_step=bytes_total / steps,
        steps=steps,
        rounds=rounds,
        replans=len(lead.replans),
        restarts=lead.recovery.restarts,
        steps_redone=lead.recovery.steps_redone,
        workers_left_out=len(lead.recovery.left_out),
        workers_lost_in_place=sum(len(c.lost) for c in lead.recovery.membership),
        steps_retried=sum(c.step_in_flight == "retried" for c in lead.recovery.membership),
        busy_fraction=sum(r.compute_s for r in per_rank) / ranks_s,
        comm_fraction=sum(r.comm_s for r in per_rank) / ranks_s,
        straggler_idle_fraction=sum(r.idle_s for r in per_rank) / ranks_s,
        # share of the training loop spent recording figures (rank 0 writes progress each step)
        tracking_overhead_fraction=max(r.bookkeeping_s for r in ranks) / loop,
        data_wait_fraction=sum(r.data_wait_s for r in per_rank) / ranks_s,
        s3_bytes_read=sum(r.cache.bytes_read for r in ranks),
        cache_hit_ratio=hits / (hits + misses) if hits + misses else 0.0,
        ranks=per_rank,
        **eval_figures(lead.evals, target_accuracy, target_val_loss),
        **wall_figures(lead, global_batch),
    )


def wall_figures(lead: RankResult, global_batch: int) -> dict[str, float]:
    """Rank 0's wall clock (`Timeline`), where it was recorded: `startup_s` (from submit to the
    first step: launch, set-up, 'auto''s trials), `trials_s`, `eval_s`, `checkpoint_s`,
    `steps_wall_s` (first step to the loop's end, everything between the steps included) and
    `steady_samples_per_s` (the samples of the steps this process ran after the warm-up over
    their wall clock, the time between them included, evaluations and checkpoints not).

    >>> from hetflow.records import StepRecord, Timeline
    >>> line = Timeline(first_step_s=5.0, steady_from_s=5.5, loop_end_s=9.0, eval_s=0.5)
    >>> records = [StepRecord.model_construct(step=s) for s in range(31)]
    >>> w = wall_figures(RankResult(rank=0, records=records, plans=[], timeline=line), 100)
    >>> w["startup_s"], w["steps_wall_s"], w["steady_samples_per_s"]
    (5.0, 4.0, 1000.0)
    """
    line = lead.timeline
    if line.loop_end_s <= 0:
        return {}
    steady = line.loop_end_s - line.steady_from_s - line.eval_s - line.checkpoint_s
    # the steps this process ran after its warm-up: a resumed run's records start before it
    counted = sum(r.step >= line.first_step + THROUGHPUT_SKIP_STEPS for r in lead.records)
    counted = counted or sum(r.step >= line.first_step for r in lead.records)
    return {
        "startup_s": line.first_step_s,
        **startup_phases(lead),
        "trials_s": line.trials_s,
        "eval_s": line.eval_s,
        "checkpoint_s": line.checkpoint_s,
        "steps_wall_s": line.loop_end_s - line.first_step_s,
        "steady_samples_per_s": global_batch * counted / steady if steady > 0 else 0.0,
    }


def startup_phases(r: RankResult) -> dict[str, float]:
    """The rank's start-up by phase (`records.StartupPhases`) as figures, `startup_NAME_s`;
    none where its launcher did not mark them (every phase 0).

    >>> from hetflow.records import StartupPhases, Timeline
    >>> line = Timeline(startup=StartupPhases(spawn_s=1.0, import_s=2.5))
    >>> startup_phases(RankResult(rank=0, records=[], plans=[], timeline=line))["startup_import_s"]
    2.5
    """
    phases = r.timeline.startup
    if not any(v for _, v in phases):
        return {}
    return {f"startup_{name}": v for name, v in phases}


def end_to_end(metrics: RunMetrics, run_s: float, profiling_time_s: float) -> RunMetrics:
    """`metrics` with what the variant paid from the start of its job: `run_time_s` (submit
    to result, launch included), `profiling_time_s` (its profile, 0 where its plan needs none
    or reuses one), `end_to_end_s` (the two) and `end_to_end_time_to_target_s` (profile, then
    submit to the evaluation that met the target), where the run recorded when that was.

    >>> m = end_to_end(RunMetrics(time_to_target_wall_s=7.0), run_s=12.0, profiling_time_s=3.0)
    >>> m.end_to_end_s, m.end_to_end_time_to_target_s
    (15.0, 10.0)
    """
    wall = metrics.time_to_target_wall_s
    return metrics.model_copy(
        update={
            "run_time_s": run_s,
            "profiling_time_s": profiling_time_s,
            "end_to_end_s": profiling_time_s + run_s,
            "end_to_end_time_to_target_s": None if wall is None else profiling_time_s + wall,
        }
    )


def needs_profile(train: TrainConfig) -> bool:
    """Whether a variant's plan is made from a profile measured before its first step: the
    static plan ('proportional'), and 'dynamic' with `profile_first`; a 'dynamic' run without
    it plans from a prior and learns from its own steps (`training.plan.prior`)."""
    return train.schedule == "proportional" or (train.schedule == "dynamic" and train.profile_first)


def eval_figures(
    evals: list[EvalPoint], target_accuracy: float | None, target_val_loss: float | None
) -> dict[str, float]:
    """`final_accuracy` or `final_val_loss` (and `final_perplexity`) of the last evaluation;
    `time_to_target_s` of the first that met the target of the figure it has.

    >>> e = [EvalPoint(step=10, train_time_s=1.0, val_loss=3.0),
    ...      EvalPoint(step=20, train_time_s=2.0, val_loss=2.0)]
    >>> eval_figures(e, target_accuracy=0.9, target_val_loss=2.5)
    {'final_val_loss': 2.0, 'time_to_target_s': 2.0}
    """
    if not evals:
        return {}
    last, m = evals[-1], {}
    if last.accuracy is not None:
        m["final_accuracy"] = last.accuracy
    if last.val_loss is not None:
        m["final_val_loss"] = last.val_loss
    if last.perplexity is not None:
        m["final_perplexity"] = last.perplexity
    hit = next((e for e in evals if _met(e, target_accuracy, target_val_loss)), None)
    if hit is not None:
        m["time_to_target_s"] = hit.train_time_s
        if hit.wall_s is not None:
            m["time_to_target_wall_s"] = hit.wall_s
    return m


def _met(e: EvalPoint, target_accuracy: float | None, target_val_loss: float | None) -> bool:
    if e.accuracy is not None and target_accuracy is not None:
        return e.accuracy >= target_accuracy
    if e.val_loss is not None and target_val_loss is not None:
        return e.val_loss <= target_val_loss
    return False


def _rank_figures(r: RankResult) -> RankFigures:
    """One rank's figures over the whole run."""
    recs = r.records
    total = sum(x.step_s for x in recs)
    compute = sum(x.compute_s for x in recs)
    samples = sum(x.batch for x in recs)
    return RankFigures(
        rank=r.rank,
        busy_fraction=compute / total,
        compute_s=compute,
        comm_s=sum(x.comm_s for x in recs),
        data_wait_s=sum(x.data_s for x in recs),
        idle_s=sum(x.idle_s for x in recs),
        local_batch=recs[-1].batch,
        samples_per_s=samples / compute if compute else 0.0,
        comm_bytes=sum(x.bytes_sent for x in recs),
        inner_steps_per_round=sum(x.inner_steps for x in recs) / len(recs)
        if any(x.inner_steps for x in recs)
        else None,
        state_bytes=r.state_bytes,
        peak_memory_bytes=r.peak_device_bytes,
        startup_s=r.timeline.first_step_s or None,
        **startup_phases(r),
    )


def step_records(result: RunResult) -> list[StepRecord]:
    """One record per step the run made, in step order: the lead's, and for the steps
    before its first (a lead that joined in place has none before its join), the record of
    the first process (`RunResult.stretches`) that ran the step."""
    lead = result.lead.records
    earlier: dict[int, StepRecord] = {}
    for r in result.stretches:
        for rec in r.records:
            if not lead or rec.step < lead[0].step:
                earlier.setdefault(rec.step, rec)
    return [earlier[s] for s in sorted(earlier)] + list(lead)


def step_series(result: RunResult, global_batch: int) -> list[StepFigures]:
    """Per step the run made (`step_records`): global mean loss (over the counts
    the recipe's loss sums over), step time (rank 0's, or the lead's), and per-rank busy
    fraction and batch, of every process that ran the step (those that left in place too;
    not those lost, whose records the survivors rebuilt without their loss)."""
    ranks = sorted([*result.ranks, *result.departed], key=lambda r: r.rank)
    # by step, not by position: under `on_loss: continue` the ranks' records may differ in
    # length (a rank that joined in place has none before its join, one that left none after)
    by_step = [{x.step: x for x in r.records} for r in ranks]
    series = []
    for lead in step_records(result):
        recs = [
            (r.rank, m[lead.step]) for r, m in zip(ranks, by_step, strict=True) if lead.step in m
        ]
        counts = [x.count for _, x in recs]
        over = global_batch if None in counts else max(sum(counts), 1)
        series.append(
            StepFigures(
                step=lead.step,
                loss=sum(x.loss_sum for _, x in recs) / over,
                step_time_s=lead.step_s,
                ranks=[
                    StepRank(
                        rank=rank,
                        busy_fraction=x.compute_s / x.step_s,
                        local_batch=x.batch,
                    )
                    for rank, x in recs
                ],
            )
        )
    return series


def met_target(metrics: RunMetrics, train: TrainConfig) -> bool:
    """The run's final evaluation met the target of the figure the recipe evaluates."""
    if metrics.final_accuracy is not None and train.target_accuracy is not None:
        return metrics.final_accuracy >= train.target_accuracy
    if metrics.final_val_loss is not None and train.target_val_loss is not None:
        return metrics.final_val_loss <= train.target_val_loss
    return False
