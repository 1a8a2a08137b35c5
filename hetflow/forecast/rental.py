"""What `hetflow recommend` and the `recommend` flow share around the search (`search.search`):
the candidates of the rental market (the offline catalog and its prices, read by the caller),
the table of the best mixes and its notes, the figures, and the cluster file of the choice.
The command prints them; the flow puts them in a Prefect artifact and an MLflow run. Bad input
is one line (a RecommendError), the same in both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hetflow.config import suggestion
from hetflow.forecast.measured import MeasuredCurve
from hetflow.forecast.models import MODELS, NAMES, ModelSpec
from hetflow.forecast.search import (
    CURVE_MODEL,
    PRESET_OF_GPU,
    PUBLISHED_BATCH,
    Candidate,
    Job,
    Prediction,
    Recommendation,
    RecommendError,
    curve_for,
)
from hetflow.forecast.spot_table import spot_notes, spot_terms

SHOWN = 6  # alternatives in the table
LEFT = ("mix", "market", "why it loses")  # columns of text
COLUMNS = ("mix", "GPUs", "step ms", "hours", "cost $", "$/h", "why it loses")
SPOT_COLUMNS = ("mix", "market", "GPUs", "step ms", "interruptions", "hours", "cost $", "$/h")


@dataclass(frozen=True)
class History:
    """What the profile history under `url` holds for the candidates: a measured curve per
    instance type with a fresh entry, and a line per type whose newest entry is too old."""

    url: str
    max_age_h: float
    curves: dict[str, MeasuredCurve]
    stale: dict[str, str]  # instance type -> 'its newest entry is N h old (> M h)'


def no_history(name: str, job: Job, history: History | None) -> str:
    """Why `name` has no measured curve either, and how to give it one."""
    how = (
        f"profile one {name} for {job.model.name} (a cluster file of one worker with "
        f"instance_type {name}, emulate: false, run by `hetflow profile --cluster FILE` on it)"
    )
    if history is None:
        return f"or {how} and pass its history to --profiles"
    if name in history.stale:
        return f"its profile history under {history.url} is stale ({history.stale[name]})"
    return f"no profile history of it for {job.model.name} under {history.url}: {how}"


def model_of(recipe: str) -> ModelSpec:
    """The figures of `recipe` (the simulator's models), or one line naming the choices."""
    if recipe not in MODELS:
        raise RecommendError(
            f"--recipe: {recipe!r} is not a model recommend knows ({', '.join(NAMES)})"
            f"{suggestion(recipe, NAMES)}"
        )
    return MODELS[recipe]


def candidates(
    mix: Sequence[tuple[str, int]],
    job: Job,
    market,
    max_local_batch: int | None = None,
    spot=None,
    history: History | None = None,
) -> list[Candidate]:
    """Candidates of `mix`, (name, count) pairs, from `market` (`hetflow.infra.market`'s: the
    offline catalog's types and their On-Demand prices) with step curves up to the global batch
    or `max_local_batch`: a type's measured one where `history` has it (`forecast.measured`),
    else its GPU's published one; spot figures from the SpotTable `spot` where given. One line
    naming a type the catalog lacks, one without a price, one without either curve (and what
    would give it one), one without spot figures."""
    names = [name for name, _ in mix]
    if len(set(names)) != len(names):
        raise RecommendError(f"--candidates: an instance type appears twice ({names})")
    types, prices = market.types, market.prices
    max_batch = min(job.global_batch, max_local_batch or job.global_batch)
    out = []
    for name, count in mix:
        if name not in types:
            families = ", ".join(sorted({k.split(".")[0] for k in types}))
            raise RecommendError(
                f"--candidates: {name} is not in the offline catalog (infra/instance_types.json: "
                f"{families}){suggestion(name, types)}"
            )
        info = types[name]
        measured = history.curves.get(name) if history is not None else None
        preset = PRESET_OF_GPU.get(info.gpu_name or "")
        if measured is not None:
            steps = measured.steps(max_batch)
        else:
            try:
                preset, steps = curve_for(name, info.gpu_name, job.model, max_batch)
            except RecommendError as e:
                raise RecommendError(f"{e}; {no_history(name, job, history)}") from None
        if name not in prices.prices:
            raise RecommendError(
                f"--candidates: {name} has no on-demand price in infra/prices.json "
                f"({prices.source}, as of {prices.as_of}); add it there"
            )
        usd = prices.prices[name]
        terms = (None, 0.0) if spot is None else spot_terms(name, usd, spot)
        args = (name, count, usd, info.devices, info.device, preset, info.network_gbps, steps)
        out.append(Candidate(*args, *terms, measured=measured and measured.source))
    return out


# -- what is shown ----------------------------------------------------------------------------


def goal(objective) -> str:
    if objective.kind == "deadline":
        return f"least cost that finishes within {objective.deadline_h:g} h"
    if objective.kind == "budget":
        return f"least time within ${objective.budget_usd:g}"
    return "least cost per sample"


def mixing_line(rec: Recommendation) -> str:
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


def outside(rec: Recommendation, batches) -> list[str]:
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
            "extrapolated in proportion, memory not checked (--max-local-batch caps them)"
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


def shown(rec: Recommendation) -> list[Prediction]:
    """The chosen mix, the next best ones, the chosen mix in the other market searched, and
    the best of each type alone."""
    rows = rec.ranked[:SHOWN]
    same = [p for p in rec.ranked if p.counts == rec.best.counts and p is not rec.best]
    rows += [p for p in [*same, *rec.singles.values()] if p not in rows]
    return rows


def spot_searched(rec: Recommendation) -> bool:
    return "spot" in rec.markets


def columns(rec: Recommendation) -> tuple[str, ...]:
    """The table's columns: with spot searched, each row's market and expected interruptions
    (its hours and cost are then expectations with them)."""
    return (*SPOT_COLUMNS, "why it loses") if spot_searched(rec) else COLUMNS


def table_rows(rec: Recommendation) -> list[tuple[str, ...]]:
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


def chosen_line(rec: Recommendation) -> str:
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


def markdown(rec: Recommendation, batches, history: History | None = None) -> str:
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
        *(f"- note: {n}" for n in outside(rec, batches)),
        "",
        f"| {' | '.join(cols)} |",
        "|" + "|".join("---" if c in LEFT else "---:" for c in cols) + "|",
        *(f"| {' | '.join(r)} |" for r in table_rows(rec)),
        "",
        f"{rec.evaluated} mixes priced.",
    ]
    return "\n".join(lines) + "\n"


# -- what is written --------------------------------------------------------------------------


def figures(rec: Recommendation, batches, seconds: float, spot=None) -> dict:
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
        "mixing_helps": rec.mixing_helps(),
        "alternatives": [row(p) for p in rec.ranked[1:SHOWN]],
        "alone": {k: row(p) for k, p in rec.singles.items()},
        "pareto": [row(p) for p in rec.front],
        "mixes_priced": rec.evaluated,
        "time_to_recommend_s": seconds,
    }


def cluster_file(rec: Recommendation) -> dict:
    """The chosen mix as a ClusterSpec mapping: one worker per GPU, named and noded by its
    instance, with its instance type and the preset that emulates it (`hetflow demo --cluster`
    takes it as is; `hetflow cluster config` makes its Ray launcher YAML). Where a type has no
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
    return {"name": "recommended", "workers": workers}


def cluster_yaml(rec: Recommendation, batches) -> str:
    """The cluster file's text, checked by ClusterSpec, with the plan and prediction as
    comments."""
    import yaml

    from hetflow.config import ClusterSpec

    data = cluster_file(rec)
    ClusterSpec.model_validate(data)
    plan = "; ".join(
        f"{c.instance_type}: {bs}" for c, bs in zip(rec.cands, batches, strict=True) if bs
    )
    head = (
        f"# hetflow recommend: {rec.best.label(rec.cands)}, predicted {rec.best.hours:.3g} h, "
        f"${rec.best.cost_usd:,.2f}\n# local batches (global {rec.job.global_batch}): {plan}\n"
    )
    return head + yaml.safe_dump(data, sort_keys=False)


def front(rec: Recommendation) -> dict:
    """What a plot of cost against time shows (`hetflow.infra.tracking.plots.cost_time_front`'s
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
