"""`hetflow recommend`: which instances to rent for a job, from the offline catalog's types and
on-demand prices and the presets' published or the history's measured step-time curves. The
flags make one `RecommendRequest`, validated once; the pipeline is the flow's own
(`hetflow.forecast.rent.recommend.recommend`); this module prints its table and writes its files.

Bad input is refused in one line before anything is searched: an instance type the catalog
lacks, a type with no step-time curve, a budget below one instance-hour; after the search, a
deadline or a budget no mix meets (naming the fastest or cheapest mix's prediction).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hetflow.config import DEADLINE_MARGIN, DEFAULT_RENTABLE, PROFILE_MAX_AGE_H, ConfigError

DEFAULT_CANDIDATES = ",".join(f"{t}:{n}" for t, n in DEFAULT_RENTABLE)


def add_recommend_args(p: argparse.ArgumentParser) -> None:
    from hetflow.config import MODEL_ALIASES
    from hetflow.forecast.simulate.models import NAMES, OLD_NAMES

    p.add_argument(
        "--candidates",
        default=DEFAULT_CANDIDATES,
        metavar="TYPE:COUNT,...",
        help="instance types that may be rented and how many of each can be had",
    )
    p.add_argument(
        "--recipe",
        default="resnet50",
        type=lambda name: OLD_NAMES.get(name, name),  # a name before recipes: still taken
        choices=NAMES + tuple(MODEL_ALIASES),
        metavar="{" + ",".join(NAMES) + "}",
        help="the model whose FLOPs and gradient size scale the curves (the simulator's); "
        "resnet, training's ResNet name, means resnet50",
    )
    p.add_argument(
        "--global-batch",
        type=int,
        default=256,
        dest="global_batch",
        help="samples per step, shared among every rented GPU",
    )
    p.add_argument("--steps", type=int, default=10_000, help="training steps of the job")
    p.add_argument(
        "--precision",
        default="mixed",
        choices=("mixed", "fp32"),
        help="what the job trains in, for the memory caps (fp32: about half the batch)",
    )
    add_goal_args(p)
    add_output_args(p)
    add_history_args(p)
    add_market_args(p)


def add_goal_args(p: argparse.ArgumentParser) -> None:
    """--deadline-h or --budget, the deadline's margin, and the largest local batch."""
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
        "--deadline-margin",
        type=float,
        dest="deadline_margin",
        metavar="F",
        help="with --deadline-h, the share of it kept in hand for the prediction's error: a mix "
        f"must be predicted to finish by (1 - F) x H (default {DEADLINE_MARGIN:g})",
    )
    p.add_argument(
        "--max-local-batch",
        type=int,
        dest="max_local_batch",
        metavar="N",
        help="the largest local batch of any GPU (default: what its memory holds, where the "
        "model's memory per sample or a measured cap is known)",
    )


def add_history_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--profiles",
        metavar="URL",
        help="the profile history (e.g. s3://hetflow-data/profiles/types, where profile, "
        "train and the demo write it): a type measured there, without emulation, on --recipe, "
        "gets its measured step-time curve and memory cap in place of the published curve",
    )
    p.add_argument(
        "--profile-max-age-h",
        type=float,
        default=PROFILE_MAX_AGE_H,
        dest="profile_max_age_h",
        metavar="H",
        help="use history at most H hours old (default: %(default)g, as train's "
        "--profile-max-age-h)",
    )


def add_output_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--output",
        "-o",
        default="recommended-cluster.yaml",
        metavar="PATH",
        help="write the chosen mix's cluster file (ClusterSpec YAML) here",
    )
    p.add_argument(
        "--ray-config",
        dest="ray_config",
        metavar="PATH",
        help="write the chosen mix's Ray cluster-launcher YAML for AWS here (`ray up PATH`); "
        "default: beside the cluster file, as NAME-ray.yaml; '' for none",
    )
    p.add_argument(
        "--plot", metavar="PATH", help="also plot cost against time, Pareto front marked (PNG)"
    )
    p.add_argument("--json", dest="json_path", metavar="PATH", help="also write the figures here")


def add_market_args(p: argparse.ArgumentParser) -> None:
    from hetflow.forecast.rent.spot import SPOT_RESTART_S

    p.add_argument(
        "--market",
        default="on-demand",
        choices=("on-demand", "spot", "both"),
        help="rent on-demand, on spot (its price; time and cost expected with interruptions), or "
        "whichever is best (a mix is rented all in one market)",
    )
    p.add_argument(
        "--spot-table",
        dest="spot_table",
        metavar="PATH",
        help="spot discounts and interruption rates per type (JSON as infra/spot.json, which is "
        "a hand-written snapshot of AWS's Spot Instance Advisor)",
    )
    p.add_argument(
        "--spot-discount",
        dest="spot_discount",
        metavar="TYPE:FRACTION,...",
        help="a candidate's spot discount off On-Demand, e.g. g4dn.xlarge:0.6",
    )
    p.add_argument(
        "--interruptions",
        metavar="TYPE:PER_MONTH,...",
        help="a candidate's interruptions per spot instance-month, e.g. p3.2xlarge:0.3",
    )
    p.add_argument(
        "--restart-s",
        type=float,
        dest="restart_s",
        metavar="S",
        help=f"seconds an interruption costs before training goes on (default {SPOT_RESTART_S:g}: "
        "the training group's restart from its checkpoint; add the time a new instance takes "
        "to boot and join)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=int,
        dest="checkpoint_every",
        metavar="N",
        help="the job's checkpoint interval: an interruption redoes N/2 steps on average "
        "(default: TrainConfig's, 25)",
    )


# the flag of each field of a RecommendRequest: a validation error names the flag
FLAGS = {
    "job.recipe": "--recipe",
    "job.global_batch": "--global-batch",
    "job.steps": "--steps",
    "job.max_local_batch": "--max-local-batch",
    "job.precision": "--precision",
    "candidates": "--candidates",
    "objective.deadline_h": "--deadline-h",
    "objective.budget_usd": "--budget",
    "objective.deadline_margin": "--deadline-margin",
    "market.kind": "--market",
    "market.spot_table": "--spot-table",
    "market.restart_s": "--restart-s",
    "market.checkpoint_every": "--checkpoint-every",
    "market.overrides": "--spot-discount/--interruptions",
    "market.overrides.discount": "--spot-discount",
    "market.overrides.interruptions_per_month": "--interruptions",
    "history.max_age_h": "--profile-max-age-h",
}


def flag_of(loc) -> str:
    """The flag of a validation error's location, e.g. ('job', 'steps') -> '--steps'."""
    names = [str(p) for p in loc if not isinstance(p, int)]
    for n in range(len(names), 0, -1):
        if ".".join(names[:n]) in FLAGS:
            return FLAGS[".".join(names[:n])]
    return ".".join(names) or "config"


def type_values(flag: str, text: str | None) -> dict[str, float]:
    """`"g4dn.xlarge:0.6,p3.2xlarge:0.5"` -> {type: value}; one line naming `flag` if not."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        name, sep, value = part.rpartition(":")
        try:
            out[name] = float(value)
        except ValueError:
            sep = ""
        if not sep or not name:
            raise ConfigError(f"{flag}: expected TYPE:NUMBER, e.g. g4dn.xlarge:0.5 (got {part!r})")
    return out


def overrides_of(args) -> list[dict]:
    """--spot-discount and --interruptions as the market's per-type overrides."""
    discounts = type_values("--spot-discount", args.spot_discount)
    per_month = type_values("--interruptions", args.interruptions)
    return [
        {
            "instance_type": name,
            "discount": discounts.get(name),
            "interruptions_per_month": per_month.get(name),
        }
        for name in dict.fromkeys([*discounts, *per_month])
    ]


def request_of(args):
    """The RecommendRequest of the flags, validated once by the config models (one line naming
    the flag of the first problem)."""
    from pydantic import ValidationError

    from hetflow.cli.errors import say_alias
    from hetflow.config import MODEL_ALIASES, RecommendRequest
    from hetflow.forecast.simulate.clusters import parse_mix
    from hetflow.forecast.simulate.job import SimulationError

    try:
        mix = parse_mix(args.candidates)
    except SimulationError as e:
        raise ConfigError(str(e).replace("--mix", "--candidates")) from None
    say_alias("--recipe", args.recipe, MODEL_ALIASES)
    kind = "deadline" if args.deadline_h is not None else "cost"
    kind = "budget" if args.budget is not None else kind
    objective = {"kind": kind, "deadline_h": args.deadline_h, "budget_usd": args.budget}
    if args.deadline_margin is not None:
        objective["deadline_margin"] = args.deadline_margin
    data = {
        "job": {
            "recipe": args.recipe,
            "global_batch": args.global_batch,
            "steps": args.steps,
            "precision": args.precision,
            "max_local_batch": args.max_local_batch,
        },
        "candidates": [{"instance_type": t, "count": n} for t, n in mix],
        "objective": objective,
        "market": {
            "kind": args.market,
            "spot_table": args.spot_table,
            "overrides": overrides_of(args),
            "restart_s": args.restart_s,
            "checkpoint_every": args.checkpoint_every,
        },
        "history": {"url": args.profiles or "", "max_age_h": args.profile_max_age_h},
    }
    try:
        return RecommendRequest.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        got = first.get("input")
        shown = "" if isinstance(got, (dict, list)) or got is None else f" (got {got!r})"
        message = first["msg"].removeprefix("Value error, ")
        raise ConfigError(f"{flag_of(first['loc'])}: {message}{shown}") from None


def history_of(request):
    """The profile history the request names, read for its candidates (`tasks.history`), or
    None without one."""
    if not request.history.url:
        return None
    from hetflow.tasks.history import request_history

    return request_history(request)


def print_recommendation(rec) -> None:
    """The recommendation on the terminal: its inputs, the choice, its notes and the table."""
    from rich.table import Table

    from hetflow.forecast.rent.spot_table import restart_line
    from hetflow.forecast.rent.table import (
        LEFT,
        columns,
        curve_lines,
        goal,
        mixing_line,
        table_rows,
    )
    from hetflow.output import wide_console

    ranking, spot = rec.ranking, rec.spot
    job, cands = ranking.job, ranking.cands
    console = wide_console(160 if spot is not None else 130)
    print(
        f"hetflow recommend: {job.model.name} ({rec.precision} precision), global batch "
        f"{job.global_batch}, {job.steps} steps; objective: {goal(ranking.objective)}"
    )
    for line in curve_lines(cands, rec.history):
        print(f"  step-time curve: {line}")
    print(f"  prices: on-demand, {rec.price_source}")
    if spot is not None:
        print(f"  spot: {spot.source}, as of {spot.as_of} (written down by hand, not fetched)")
        print(f"  {restart_line(ranking)}")
    print(rec.summary())
    for c, bs in zip(cands, rec.batches, strict=True):
        if bs:
            print(f"  local batches on {c.instance_type}: {', '.join(map(str, bs))}")
    print(f"  {mixing_line(ranking)}")
    for note in rec.all_notes():
        print(f"  note: {note}")
    table = Table(title=f"the best mixes ({ranking.evaluated} priced in {rec.seconds:.2f} s)")
    for col in columns(ranking):
        table.add_column(col, justify="left" if col in LEFT else "right")
    for row in table_rows(ranking):
        table.add_row(*row)
    console.print(table)


def write_cluster(path: str, rec) -> None:
    """The cluster file (checked by ClusterSpec, the plan and the prediction as comments)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(rec.cluster_yaml())
    workers = len(rec.cluster_file()["workers"])
    counted = f"{workers} worker" + ("" if workers == 1 else "s")
    print(f"wrote {path} ({counted}); emulate it here: `hetflow demo --cluster {path}`")


def write_ray_config(path: str, rec) -> None:
    """The Ray launcher YAML of the choice (`infra.ray_cluster.ray_yaml`, as `hetflow cluster
    config` writes it)."""
    from hetflow.infra.ray_cluster import ray_yaml

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(ray_yaml(rec.cluster()))
    print(f"wrote {path}: the Ray cluster launcher's config for AWS (`ray up {path}`)")


def cmd_recommend(args) -> int:
    from hetflow.forecast.rent.recommend import recommend
    from hetflow.forecast.rent.table import front
    from hetflow.infra.market import load_market
    from hetflow.output import write_json

    request = request_of(args)
    rec = recommend(request, history_of(request), load_market(request.market))
    print_recommendation(rec)
    write_cluster(args.output, rec)
    ray_config = args.ray_config
    if ray_config is None:
        ray_config = str(Path(args.output).with_name(Path(args.output).stem + "-ray.yaml"))
    if ray_config:
        write_ray_config(ray_config, rec)
    write_json(args.json_path, rec.figures())
    if args.plot:
        from hetflow.infra.report.plots import cost_time_front

        cost_time_front(args.plot, **front(rec.ranking))
        print(f"wrote {args.plot}")
    return 0
