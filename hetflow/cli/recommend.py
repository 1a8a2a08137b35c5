"""`hetflow recommend`: which instances to rent for a job, from the offline catalog's types and
on-demand prices and the presets' published step-time curves (the search:
`hetflow.forecast.search`; the table, figures and cluster file it shares with the
`recommend` flow: `hetflow.forecast.rental`).

Bad input is refused in one line before anything is searched: an instance type the catalog
lacks, a type with no step-time curve, a budget below one instance-hour; after the search, a
deadline or a budget no mix meets (naming the fastest or cheapest mix's prediction).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from hetflow.config import DEADLINE_MARGIN, DEFAULT_RENTABLE, PROFILE_MAX_AGE_H, ConfigError

DEFAULT_CANDIDATES = ",".join(f"{t}:{n}" for t, n in DEFAULT_RENTABLE)


def add_recommend_args(p: argparse.ArgumentParser) -> None:
    from hetflow.forecast.models import NAMES, OLD_NAMES

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
        choices=NAMES,
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
        "--deadline-margin",
        type=float,
        dest="deadline_margin",
        metavar="F",
        help="with --deadline-h, the share of it kept in hand for the prediction's error: a mix "
        f"must be predicted to finish by (1 - F) x H (default {DEADLINE_MARGIN:g})",
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
    add_output_args(p)
    add_history_args(p)
    add_market_args(p)


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
    from hetflow.forecast.spot import SPOT_RESTART_S

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


def _positive(flag: str, value, kind=float):
    if value is not None and not (value > 0 and value == value and value != float("inf")):
        raise ConfigError(f"{flag}: must be a finite number > 0 (got {value!r})")
    return kind(value) if value is not None else None


def job_and_objective(args):
    """The Job and Objective of the flags, each value checked (one line naming its flag)."""
    from hetflow.forecast.models import MODELS
    from hetflow.forecast.search import Job, Objective

    steps = _positive("--steps", args.steps, int)
    batch = _positive("--global-batch", args.global_batch, int)
    job = Job(MODELS[args.recipe], global_batch=batch, steps=steps)
    margin = DEADLINE_MARGIN if args.deadline_margin is None else args.deadline_margin
    if not 0 <= margin < 1:
        raise ConfigError(f"--deadline-margin: must be in [0, 1) (got {margin:g})")
    if args.deadline_margin is not None and args.deadline_h is None:
        raise ConfigError("--deadline-margin: only with --deadline-h")
    if args.deadline_h is not None:
        deadline = _positive("--deadline-h", args.deadline_h)
        return job, Objective("deadline", deadline_h=deadline, margin=margin)
    if args.budget is not None:
        return job, Objective("budget", budget_usd=_positive("--budget", args.budget))
    return job, Objective("cost")


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


def history_of(args, job):
    """The profile history `--profiles` names, read for the candidates (`tasks.history`), or
    None without the flag."""
    if not args.profiles:
        return None
    from hetflow.forecast.clusters import parse_mix
    from hetflow.forecast.job import SimulationError
    from hetflow.tasks.history import read_type_history

    max_age = _positive("--profile-max-age-h", args.profile_max_age_h)
    try:
        names = [name for name, _ in parse_mix(args.candidates)]
    except SimulationError:
        names = []  # candidates_of says what is wrong with them
    return read_type_history(args.profiles.rstrip("/"), names, job.model.name, max_age)


def candidates_of(text: str, job, max_local_batch: int | None = None, spot=None, history=None):
    """The Candidates of --candidates, from the shipped catalog (offline), with the SpotTable
    `spot`'s figures where given; one line naming a type the catalog lacks, one without a
    price, one without a step-time curve, one without spot figures."""
    from hetflow.forecast.clusters import parse_mix
    from hetflow.forecast.job import SimulationError
    from hetflow.forecast.rental import candidates
    from hetflow.infra.market import load_market

    try:
        mix = parse_mix(text)
    except SimulationError as e:
        raise ConfigError(str(e).replace("--mix", "--candidates")) from None
    market = load_market()
    return candidates(mix, job, market, max_local_batch, spot, history), market.prices


def market_of(args):
    """(Markets searched, Restart, SpotTable or None) of the market flags, checked."""
    from hetflow.forecast.clusters import parse_mix
    from hetflow.forecast.job import SimulationError
    from hetflow.forecast.spot_table import market_setup
    from hetflow.infra.market import load_market

    try:
        names = [name for name, _ in parse_mix(args.candidates)]
    except SimulationError:
        names = []  # candidates_of says what is wrong with them
    market = load_market(args.market != "on-demand", args.spot_table)
    return market_setup(
        args.market,
        names,
        market,
        args.spot_table,
        type_values("--spot-discount", args.spot_discount),
        type_values("--interruptions", args.interruptions),
        args.restart_s,
        args.checkpoint_every,
    )


def print_recommendation(rec, batches, prices, seconds: float, spot=None, history=None) -> None:
    from rich.table import Table

    from hetflow.forecast.rental import (
        LEFT,
        chosen_line,
        columns,
        curve_lines,
        goal,
        mixing_line,
        outside,
        table_rows,
    )
    from hetflow.output import wide_console

    job, cands = rec.job, rec.cands
    console = wide_console(160 if spot is not None else 130)
    print(
        f"hetflow recommend: {job.model.name}, global batch {job.global_batch}, {job.steps} "
        f"steps; objective: {goal(rec.objective)}"
    )
    for line in curve_lines(cands, history):
        print(f"  step-time curve: {line}")
    print(f"  prices: on-demand, {prices.source}, as of {prices.as_of}")
    if spot is not None:
        from hetflow.forecast.spot_table import restart_line

        print(f"  spot: {spot.source}, as of {spot.as_of} (written down by hand, not fetched)")
        print(f"  {restart_line(rec)}")
    print(chosen_line(rec))
    for c, bs in zip(cands, batches, strict=True):
        if bs:
            print(f"  local batches on {c.instance_type}: {', '.join(map(str, bs))}")
    print(f"  {mixing_line(rec)}")
    for note in outside(rec, batches):
        print(f"  note: {note}")
    table = Table(title=f"the best mixes ({rec.evaluated} priced in {seconds:.2f} s)")
    for col in columns(rec):
        table.add_column(col, justify="left" if col in LEFT else "right")
    for row in table_rows(rec):
        table.add_row(*row)
    console.print(table)


def write_cluster(path: str, rec, batches) -> None:
    """The cluster file (`rental.cluster_yaml`: checked by ClusterSpec, the plan and the
    prediction as comments)."""
    from hetflow.forecast.rental import cluster_yaml

    text = cluster_yaml(rec, batches)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)
    workers = sum(c.devices * n for c, n in zip(rec.cands, rec.best.counts, strict=True))
    counted = f"{workers} worker" + ("" if workers == 1 else "s")
    print(f"wrote {path} ({counted}); emulate it here: `hetflow demo --cluster {path}`")


def write_ray_config(path: str, rec) -> None:
    """The Ray launcher YAML of the choice (`rental.ray_yaml`, as `hetflow cluster config`)."""
    from hetflow.config import ClusterSpec
    from hetflow.forecast.rental import cluster_file
    from hetflow.infra.ray_cluster import ray_yaml

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(ray_yaml(ClusterSpec.model_validate(cluster_file(rec))))
    print(f"wrote {path}: the Ray cluster launcher's config for AWS (`ray up {path}`)")


def cmd_recommend(args) -> int:
    from hetflow.forecast.rental import figures, front
    from hetflow.forecast.search import local_batches, search
    from hetflow.output import write_json

    job, objective = job_and_objective(args)
    cap = _positive("--max-local-batch", args.max_local_batch, int)
    markets, restart, spot = market_of(args)
    history = history_of(args, job)
    cands, prices = candidates_of(args.candidates, job, cap, spot, history)
    t = time.perf_counter()
    rec = search(cands, job, objective, markets, restart)
    batches = local_batches(cands, rec.best, job.global_batch)
    seconds = time.perf_counter() - t
    print_recommendation(rec, batches, prices, seconds, spot, history)
    write_cluster(args.output, rec, batches)
    ray_config = args.ray_config
    if ray_config is None:
        ray_config = str(Path(args.output).with_name(Path(args.output).stem + "-ray.yaml"))
    if ray_config:
        write_ray_config(ray_config, rec)
    write_json(args.json_path, figures(rec, batches, seconds, spot))
    if args.plot:
        from hetflow.infra.tracking.plots import cost_time_front

        cost_time_front(args.plot, **front(rec))
        print(f"wrote {args.plot}")
    return 0
