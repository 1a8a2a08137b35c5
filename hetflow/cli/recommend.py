"""`hetflow recommend`: which instances to rent for a job, from the offline catalog's types and
on-demand prices and the presets' published step-time curves (`hetflow.recommend`).

Bad input is refused in one line before anything is searched: an instance type the catalog
lacks, a type with no step-time curve, a budget below one instance-hour; after the search, a
deadline or a budget no mix meets (naming the fastest or cheapest mix's prediction).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from hetflow.config import ConfigError

DEFAULT_CANDIDATES = "g4dn.xlarge:4,p3.2xlarge:2,p4d.24xlarge:1"
SHOWN = 6  # alternatives in the table


def add_recommend_args(p: argparse.ArgumentParser) -> None:
    from hetflow.simulator.model import MODELS

    p.add_argument(
        "--candidates",
        default=DEFAULT_CANDIDATES,
        metavar="TYPE:COUNT,...",
        help="instance types that may be rented and how many of each can be had",
    )
    p.add_argument(
        "--recipe",
        default="resnet50",
        choices=sorted(MODELS),
        help="the model whose FLOPs and gradient size scale the curves (the simulator's)",
    )
    p.add_argument(
        "--global-batch",
        type=int,
        default=256,
        dest="global_batch",
        help="samples per step, shared among every rented GPU",
    )
    p.add_argument("--steps", type=int, default=10_000, help="training steps of the job")
    goal = p.add_mutually_exclusive_group()
    goal.add_argument(
        "--deadline-h",
        type=float,
        dest="deadline_h",
        metavar="H",
        help="least cost that finishes within H hours",
    )
    goal.add_argument(
        "--budget", type=float, metavar="USD", help="least time that costs at most USD"
    )
    p.add_argument(
        "--output",
        "-o",
        default="recommended-cluster.yaml",
        metavar="PATH",
        help="write the chosen mix's cluster file (ClusterSpec YAML) here",
    )
    p.add_argument(
        "--max-local-batch",
        type=int,
        dest="max_local_batch",
        metavar="N",
        help="the largest local batch a GPU holds (memory is not modelled; default: any)",
    )
    p.add_argument(
        "--plot", metavar="PATH", help="also plot cost against time, Pareto front marked (PNG)"
    )
    p.add_argument("--json", dest="json_path", metavar="PATH", help="also write the figures here")


def _positive(flag: str, value, kind=float):
    if value is not None and not (value > 0 and value == value and value != float("inf")):
        raise ConfigError(f"{flag}: must be a finite number > 0 (got {value!r})")
    return kind(value) if value is not None else None


def job_and_objective(args):
    """The Job and Objective of the flags, each value checked (one line naming its flag)."""
    from hetflow.recommend import Job, Objective
    from hetflow.simulator.model import MODELS

    steps = _positive("--steps", args.steps, int)
    batch = _positive("--global-batch", args.global_batch, int)
    job = Job(MODELS[args.recipe], batch, steps)
    if args.deadline_h is not None:
        return job, Objective("deadline", deadline_h=_positive("--deadline-h", args.deadline_h))
    if args.budget is not None:
        return job, Objective("budget", budget_usd=_positive("--budget", args.budget))
    return job, Objective("cost")


def candidates_of(text: str, job, max_local_batch: int | None = None):
    """The Candidates of --candidates, from the shipped catalog (offline); one line naming a
    type the catalog lacks, one without a price, one without a step-time curve."""
    from hetflow.cli.parser import suggestion
    from hetflow.infra.catalog import load_snapshot
    from hetflow.infra.pricing import load_prices
    from hetflow.recommend import Candidate, curve_for
    from hetflow.simulator.clusters import parse_mix
    from hetflow.simulator.model import SimulationError

    try:
        mix = parse_mix(text)
    except SimulationError as e:
        raise ConfigError(str(e).replace("--mix", "--candidates")) from None
    types, prices = load_snapshot(), load_prices()
    max_batch = min(job.global_batch, max_local_batch or job.global_batch)
    out = []
    for name, count in mix:
        if name not in types:
            families = ", ".join(sorted({k.split(".")[0] for k in types}))
            raise ConfigError(
                f"--candidates: {name} is not in the offline catalog (infra/instance_types.json: "
                f"{families}){suggestion(name, types)}"
            )
        info = types[name]
        preset, steps = curve_for(name, info.gpu_name, job.model, max_batch)
        if name not in prices.prices:
            raise ConfigError(
                f"--candidates: {name} has no on-demand price in infra/prices.json "
                f"({prices.source}, as of {prices.as_of}); add it there"
            )
        out.append(
            Candidate(
                name,
                count,
                prices.prices[name],
                info.devices,
                info.device,
                preset,
                info.network_gbps,
                steps,
            )
        )
    return out, prices


def cluster_file(rec) -> dict:
    """The chosen mix as a ClusterSpec mapping: one worker per GPU, named and noded by its
    instance, with its instance type and the preset that emulates it (`hetflow demo --cluster`
    takes it as is; `hetflow cluster config` makes its Ray launcher YAML)."""
    workers = []
    for c, n in zip(rec.cands, rec.best.counts, strict=True):
        stem = c.instance_type.replace(".", "-")
        for i in range(n):
            for g in range(c.devices):
                name = f"{stem}-{i}" + (f"-gpu{g}" if c.devices > 1 else "")
                workers.append(
                    {
                        "name": name,
                        "instance_type": c.instance_type,
                        "preset": c.preset,
                        "node": f"{stem}-{i}",
                    }
                )
    return {"name": "recommended", "workers": workers}


def _goal(objective) -> str:
    if objective.kind == "deadline":
        return f"least cost that finishes within {objective.deadline_h:g} h"
    if objective.kind == "budget":
        return f"least time within ${objective.budget_usd:g}"
    return "least cost per sample"


def _mixing_line(rec) -> str:
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


def _outside(rec, batches) -> list[str]:
    """Where the prediction leaves what was published."""
    from hetflow.recommend import CURVE_MODEL, PUBLISHED_BATCH

    notes = []
    if rec.job.model.name != CURVE_MODEL:
        notes.append(
            f"the curves were published for {CURVE_MODEL}; {rec.job.model.name}'s are scaled by "
            "FLOPs per sample, latency floor included: absolute times are rough"
        )
    top = max(max(bs) for bs in batches if bs)
    if top > PUBLISHED_BATCH:
        notes.append(
            f"local batches up to {top}, past the largest published one ({PUBLISHED_BATCH}): "
            "extrapolated in proportion, memory not checked (--max-local-batch caps them)"
        )
    return notes


def _shown(rec) -> list:
    """The chosen mix, the next best ones, and the best of each type alone."""
    rows = rec.ranked[:SHOWN]
    rows += [p for p in rec.singles.values() if p not in rows]
    return rows


def print_recommendation(rec, batches, prices, seconds: float) -> None:
    from rich.table import Table

    from hetflow.output import wide_console

    obj, job, best, cands = rec.objective, rec.job, rec.best, rec.cands
    console = wide_console(130)
    print(
        f"hetflow recommend: {job.model.name}, global batch {job.global_batch}, {job.steps} "
        f"steps; objective: {_goal(obj)}"
    )
    curves = ", ".join(f"{c.instance_type} -> {c.preset} ({c.gpu})" for c in cands)
    print(f"  step-time curves: {curves} (published, hetflow/emulation/presets.py)")
    print(f"  prices: on-demand, {prices.source}, as of {prices.as_of}; spot: not in the catalog")
    print(
        f"chosen: {best.label(cands)}: predicted {best.hours:.3g} h, ${best.cost_usd:,.2f} "
        f"(${best.usd_per_hour:,.2f}/h; step {best.step_s * 1e3:.1f} ms = compute "
        f"{best.compute_s * 1e3:.1f} + all-reduce {best.comm_s * 1e3:.1f})"
    )
    for c, bs in zip(cands, batches, strict=True):
        if bs:
            print(f"  local batches on {c.instance_type}: {', '.join(map(str, bs))}")
    print(f"  {_mixing_line(rec)}")
    for note in _outside(rec, batches):
        print(f"  note: {note}")
    table = Table(title=f"the best mixes ({rec.evaluated} priced in {seconds:.2f} s)")
    for col in ("mix", "GPUs", "step ms", "hours", "cost $", "$/h", "why it loses"):
        table.add_column(col, justify="left" if col in ("mix", "why it loses") else "right")
    for p in _shown(rec):
        gpus = sum(c.devices * n for c, n in zip(cands, p.counts, strict=True))
        why = "chosen" if p is best else obj.why_loses(p, best)
        table.add_row(
            p.label(cands),
            str(gpus),
            f"{p.step_s * 1e3:.1f}",
            f"{p.hours:.3g}",
            f"{p.cost_usd:,.2f}",
            f"{p.usd_per_hour:,.2f}",
            why,
        )
    console.print(table)


def _figures(rec, batches, seconds: float) -> dict:
    def row(p) -> dict:
        return {
            "mix": {c.instance_type: n for c, n in zip(rec.cands, p.counts, strict=True) if n},
            "step_s": p.step_s,
            "compute_s": p.compute_s,
            "comm_s": p.comm_s,
            "hours": p.hours,
            "cost_usd": p.cost_usd,
            "usd_per_hour": p.usd_per_hour,
        }

    return {
        "objective": vars(rec.objective),
        "job": {
            "recipe": rec.job.model.name,
            "global_batch": rec.job.global_batch,
            "steps": rec.job.steps,
        },
        "chosen": {**row(rec.best), "local_batches": batches},
        "mixing_helps": rec.mixing_helps(),
        "alternatives": [row(p) for p in rec.ranked[1:SHOWN]],
        "alone": {k: row(p) for k, p in rec.singles.items()},
        "pareto": [row(p) for p in rec.front],
        "mixes_priced": rec.evaluated,
        "time_to_recommend_s": seconds,
    }


def write_cluster(path: str, rec, batches) -> None:
    """The cluster file, checked by ClusterSpec, with the plan and prediction as comments."""
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
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(head + yaml.safe_dump(data, sort_keys=False))
    print(
        f"wrote {path} ({len(data['workers'])} workers); emulate it here: "
        f"`hetflow demo --cluster {path}`; for AWS: `hetflow cluster config {path}`"
    )


def plot_front(path: str, rec) -> None:
    """Every mix priced as a point of time and cost, the Pareto front joined, the choice ringed."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    preds = rec.ranked
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter([p.hours for p in preds], [p.cost_usd for p in preds], s=6, c="0.7", label="mixes")
    front = rec.front
    ax.plot([p.hours for p in front], [p.cost_usd for p in front], "o-", ms=4, label="Pareto front")
    best = rec.best
    ax.plot([best.hours], [best.cost_usd], "o", ms=12, mfc="none", mec="C3", label="chosen")
    ax.annotate(best.label(rec.cands), (best.hours, best.cost_usd), fontsize=8)
    if rec.objective.kind == "deadline":
        ax.axvline(rec.objective.deadline_h, color="C3", ls=":", label="deadline")
    if rec.objective.kind == "budget":
        ax.axhline(rec.objective.budget_usd, color="C3", ls=":", label="budget")
    ax.set(xscale="log", yscale="log", xlabel="predicted time (h)", ylabel="predicted cost ($)")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_title(f"{rec.job.model.name}, {rec.job.steps} steps of {rec.job.global_batch}")
    ax.legend(fontsize=8)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    print(f"wrote {path}")


def cmd_recommend(args) -> int:
    from hetflow.output import write_json
    from hetflow.recommend import local_batches, search

    job, objective = job_and_objective(args)
    cap = _positive("--max-local-batch", args.max_local_batch, int)
    cands, prices = candidates_of(args.candidates, job, cap)
    t = time.perf_counter()
    rec = search(cands, job, objective)
    batches = local_batches(cands, rec.best, job.global_batch)
    seconds = time.perf_counter() - t
    print_recommendation(rec, batches, prices, seconds)
    write_cluster(args.output, rec, batches)
    write_json(args.json_path, _figures(rec, batches, seconds))
    if args.plot:
        plot_front(args.plot, rec)
    return 0
