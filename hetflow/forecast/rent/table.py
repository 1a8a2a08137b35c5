"""What a recommendation shows (`hetflow recommend` prints it; the flow puts it in a Prefect
artifact and an MLflow run): the choice, its notes, the table of the best mixes, the figures
as JSON and the points of the plot of cost against time.
"""

from __future__ import annotations

from collections.abc import Sequence

from hetflow.forecast.rent.rental import History
from hetflow.forecast.rent.search import (
    CURVE_MODEL,
    PUBLISHED_BATCH,
    Candidate,
    Prediction,
    Ranking,
)
from hetflow.forecast.rent.spot_table import spot_notes

SHOWN = 6  # alternatives in the table
LEFT = ("mix", "market", "why it loses")  # columns of text
COLUMNS = ("mix", "GPUs", "step ms", "hours", "cost $", "$/h", "why it loses")
SPOT_COLUMNS = ("mix", "market", "GPUs", "step ms", "interruptions", "hours", "cost $", "$/h")


def goal(objective) -> str:
    if objective.kind == "deadline":
        return f"least cost that finishes within {objective.deadline_h:g} h"
    if objective.kind == "budget":
        return f"least time within ${objective.budget_usd:g}"
    return "least cost per sample"


def mixing_line(rec: Ranking) -> str:
    """Whether a mix helps: the chosen one against the best of each type alone."""
    best, cands = rec.best, rec.cands
    others = [p for name, p in rec.singles.items() if p.counts != best.counts]
    if not rec.mixing_helps():
        return (
            f"a mix does not help: {best.label(cands)} alone is best; every mix of types "
            "priced is worse under this objective"
        )
    if not others:
        return "a mix helps: no type alone meets the objective"
    alone = min(others, key=rec.objective.key)
    return f"a mix helps: the best type alone, {alone.label(cands)}, " + rec.objective.why_loses(
        alone, best
    )


def outside(rec: Ranking, batches) -> list[str]:
    """Where the prediction leaves what was published or measured, and what spot's
    expectations hide."""
    notes = spot_notes(rec)
    published = [(c, bs) for c, bs in zip(rec.cands, batches, strict=True) if not c.measured]
    if rec.job.model.name != CURVE_MODEL and any(bs for _, bs in published):
        notes.append(
            f"the curves were published for {CURVE_MODEL}; {rec.job.model.name}'s are scaled by "
            "FLOPs per sample, latency floor included: absolute times are rough"
        )
    top = max((max(bs) for _, bs in published if bs), default=0)
    if top > PUBLISHED_BATCH:
        notes.append(
            f"local batches up to {top}, past the largest published one ({PUBLISHED_BATCH}): "
            "their step times are extrapolated in proportion"
        )
    return notes


def curve_lines(cands: Sequence[Candidate], history: History | None) -> list[str]:
    """Where each candidate's step-time curve comes from, and the history not used."""
    lines = [
        f"{c.instance_type} -> measured, {c.measured}"
        if c.measured
        else f"{c.instance_type} -> {c.preset} ({c.gpu}, published, hetflow/emulation/presets.py)"
        for c in cands
    ]
    for name, why in (history.stale if history is not None else {}).items():
        lines.append(f"{name}: profile history not used, {why}")
    return lines


def shown(rec: Ranking) -> list[Prediction]:
    """The chosen mix, the next best ones, the chosen mix in the other market searched, and
    the best of each type alone."""
    rows = rec.ranked[:SHOWN]
    same = [p for p in rec.ranked if p.counts == rec.best.counts and p is not rec.best]
    rows += [p for p in [*same, *rec.singles.values()] if p not in rows]
    return rows


def spot_searched(rec: Ranking) -> bool:
    return "spot" in rec.markets


def columns(rec: Ranking) -> tuple[str, ...]:
    """The table's columns: with spot searched, each row's market and expected interruptions
    (its hours and cost are then expectations with them)."""
    return (*SPOT_COLUMNS, "why it loses") if spot_searched(rec) else COLUMNS


def table_rows(rec: Ranking) -> list[tuple[str, ...]]:
    """The table of the best mixes (`columns`), as text."""
    out = []
    for p in shown(rec):
        gpus = sum(c.devices * n for c, n in zip(rec.cands, p.counts, strict=True))
        why = "chosen" if p is rec.best else rec.objective.why_loses(p, rec.best)
        spot = (p.market, f"{p.interruptions:.2g}") if spot_searched(rec) else ()
        out.append(
            (
                p.label(rec.cands, market=not spot),
                *spot[:1],
                str(gpus),
                f"{p.step_s * 1e3:.1f}",
                *spot[1:],
                f"{p.hours:.3g}",
                f"{p.cost_usd:,.2f}",
                f"{p.usd_per_hour:,.2f}",
                why,
            )
        )
    return out


def chosen_line(rec: Ranking) -> str:
    best = rec.best
    how = (
        f"expected {best.hours:.3g} h with {best.interruptions:.2g} interruptions "
        f"({best.bare_hours:.3g} h without)"
        if best.market == "spot"
        else f"predicted {best.hours:.3g} h"
    )
    return (
        f"chosen: {best.label(rec.cands)}: {how}, ${best.cost_usd:,.2f} "
        f"(${best.usd_per_hour:,.2f}/h; step {best.step_s * 1e3:.1f} ms = compute "
        f"{best.compute_s * 1e3:.1f} + all-reduce {best.comm_s * 1e3:.1f})"
    )


def markdown(rec: Ranking, batches, history: History | None = None, notes=None) -> str:
    """The choice, its notes and the table of the best mixes as markdown (the flow's Prefect
    artifact and MLflow text; the command prints the same)."""
    job, cols = rec.job, columns(rec)
    lines = [
        f"### hetflow recommend: {job.model.name}, global batch {job.global_batch}, "
        f"{job.steps} steps",
        "",
        f"objective: {goal(rec.objective)}",
        "",
        *(f"- step-time curve: {line}" for line in curve_lines(rec.cands, history)),
        "",
        f"**{chosen_line(rec)}**",
        "",
        *(
            f"- local batches on {c.instance_type}: {', '.join(map(str, bs))}"
            for c, bs in zip(rec.cands, batches, strict=True)
            if bs
        ),
        f"- {mixing_line(rec)}",
        *(f"- note: {n}" for n in (outside(rec, batches) if notes is None else notes)),
        "",
        f"| {' | '.join(cols)} |",
        "|" + "|".join("---" if c in LEFT else "---:" for c in cols) + "|",
        *(f"| {' | '.join(r)} |" for r in table_rows(rec)),
        "",
        f"{rec.evaluated} mixes priced.",
    ]
    return "\n".join(lines) + "\n"


def figures(rec: Ranking, batches, seconds: float, spot=None) -> dict:
    """The choice, the alternatives, each type alone and the Pareto front, as JSON figures,
    with the markets searched, an interruption's restart and the spot table (`spot`) used."""

    def row(p: Prediction) -> dict:
        return {
            "mix": {c.instance_type: n for c, n in zip(rec.cands, p.counts, strict=True) if n},
            "step_s": p.step_s,
            "compute_s": p.compute_s,
            "comm_s": p.comm_s,
            "hours": p.hours,
            "cost_usd": p.cost_usd,
            "usd_per_hour": p.usd_per_hour,
            "market": p.market,
            "interruptions": p.interruptions,
            "hours_uninterrupted": p.bare_hours,
        }

    return {
        "objective": vars(rec.objective),
        "job": {
            "recipe": rec.job.model.name,
            "global_batch": rec.job.global_batch,
            "steps": rec.job.steps,
        },
        "market": {
            "searched": list(rec.markets),
            "restart_s": rec.restart.restart_s,
            "checkpoint_every": rec.restart.checkpoint_every,
            "spot_table": None if spot is None else {"source": spot.source, "as_of": spot.as_of},
        },
        "chosen": {**row(rec.best), "local_batches": batches},
        "curves": {c.instance_type: c.measured or f"published ({c.preset})" for c in rec.cands},
        "memory_caps": {c.instance_type: c.memory and c.memory.cap for c in rec.cands},
        "mixing_helps": rec.mixing_helps(),
        "alternatives": [row(p) for p in rec.ranked[1:SHOWN]],
        "alone": {k: row(p) for k, p in rec.singles.items()},
        "pareto": [row(p) for p in rec.front],
        "mixes_priced": rec.evaluated,
        "time_to_recommend_s": seconds,
    }


def front(rec: Ranking) -> dict:
    """What a plot of cost against time shows (`hetflow.infra.report.plots.cost_time_front`'s
    arguments after the path): every mix priced, the Pareto front, the choice, the title, and
    the objective's deadline or budget."""
    obj = rec.objective
    return {
        "points": [(p.hours, p.cost_usd) for p in rec.ranked],
        "front": [(p.hours, p.cost_usd) for p in rec.front],
        "chosen": (rec.best.hours, rec.best.cost_usd, rec.best.label(rec.cands)),
        "title": f"{rec.job.model.name}, {rec.job.steps} steps of {rec.job.global_batch}",
        "deadline_h": obj.deadline_h if obj.kind == "deadline" else None,
        "budget_usd": obj.budget_usd if obj.kind == "budget" else None,
    }
