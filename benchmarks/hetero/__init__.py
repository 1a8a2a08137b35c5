"""`hetflow bench hetero`: equal split vs static plan vs dynamic re-balancing, in one run.

    hetflow bench hetero --speeds 1,1,2,4 --steps 150 --json hetero.json
    hetflow bench hetero --speeds 1,1,2,4 --straggler 3:60:4 --json straggler.json
    hetflow bench hetero --speeds 1,1,2,4 --straggler 3:60:4:20 --noise shared --json drift.json
    hetflow bench hetero --speeds 1,2,3,6 --repeat 3 --json mix.json
    hetflow bench hetero --memory-caps ,,,16 --variants baseline@micro,static,static@micro
    hetflow bench hetero --cpu-quotas 1,0.5,0.25,0.25 --bound --repeat 3

All variants share one profile, the dataset and the seed. Per variant: `efficiency` =
throughput / `ideal_samples_per_s` (the balanced step of the profiled a_i + c_i x b_i, with no
idle time and no communication), where the rest of the ranks' time went, and how far the
plan's model missed (`compute_model_error`, `host_pace`). Every figure and flag:
docs/benchmarks.md; figures measured: docs/measurements/scheduler.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple, get_args

from hetflow.cli.args import recipe_flag, recipe_options
from hetflow.config import (
    BUILTIN_RECIPES,
    ClusterSpec,
    ConfigError,
    DatasetSpec,
    TrainConfig,
    check_job,
    parse_speeds,
    validated,
)
from hetflow.emulation.device_model import Straggler, straggler_factor
from hetflow.infra.report.plots import rate_curves, rolling_rate
from hetflow.perf.collective import measured_ring
from hetflow.records import Plan, Profile, RunResult
from hetflow.repeats import run_order
from hetflow.training.launch.run import measure_profile, run_plan
from hetflow.training.metrics import end_to_end, needs_profile, summarize
from hetflow.training.plan import planner
from hetflow.training.plan.planner import fastest_alone, ideal_throughput, make_plan
from hetflow.training.plan.prior import equal_prior, published_prior
from hetflow.training.plan.ranks import RankMap

from benchmarks import check_bench_recipe, digits_workspace, write_json
from benchmarks.hetero.aggregate import with_speedups
from benchmarks.hetero.args import PRECISION, parser
from benchmarks.hetero.bound import bound_figures, solo_rates
from benchmarks.hetero.hardware import set_hardware
from benchmarks.hetero.history import HISTORY, history_profile, profile_charged_s
from benchmarks.hetero.model import at_run_pace, compute_model_error, steps_to_final_rate
from benchmarks.hetero.table import print_table
from benchmarks.ray_cluster import local_ray

# VARIANT@TAG: micro-batches; dynamic planned from a profile; static from the profile history
VARIANT_TAGS = ("micro", "profile", "history")
ONLY = {"profile": "dynamic", "history": "static"}  # a tag only one variant takes
# the wall-clock figures of `summarize` a variant's row shows (`metrics.wall_figures`)
WALL_FIGURES = ("startup_s", "trials_s", "eval_s", "checkpoint_s", "steady_samples_per_s")
# what the variant paid from the start of its job (`metrics.end_to_end`)
E2E_FIGURES = ("profiling_time_s", "end_to_end_s", "end_to_end_time_to_target_s")
VARIANTS = {
    "baseline": "equal",
    "static": "proportional",
    "dynamic": "dynamic",
    "fastest": "proportional",  # one worker: nothing to re-balance (`fastest_alone`)
}


def parse_straggler(text: str, world: int) -> Straggler:
    """--straggler's RANK:STEP:FACTOR[:RAMP] (pure); a one-line ConfigError naming it."""
    try:
        rank, step, factor, *ramp = text.split(":")
        if len(ramp) > 1:
            raise ValueError
        out = (int(rank), int(step), float(factor), *[int(r) for r in ramp])
    except ValueError:
        raise ConfigError(
            f"--straggler: expected RANK:STEP:FACTOR[:RAMP], e.g. 3:60:4 or 3:60:4:20 "
            f"(got {text!r})"
        ) from None
    if not 0 <= out[0] < world:
        raise ConfigError(f"--straggler: rank {out[0]} is not in 0..{world - 1}")
    if not out[2] > 0:
        raise ConfigError(f"--straggler: factor must be > 0 (got {out[2]})")
    if len(out) == 4 and out[3] < 0:
        raise ConfigError(f"--straggler: ramp must be >= 0 steps (got {out[3]})")
    return out


def run_ideal(
    profile: Profile, global_batch: int, steps: int, stragglers: list[Straggler]
) -> float:
    """Ideal samples/s over the whole run, phase by phase when a worker's speed changes (step
    by step while a straggler drifts in: `straggler_factor`)."""
    latency, per_sample = profile.step_models()
    changes = {0, steps}
    for _, at, _, *ramp in stragglers:
        changes |= set(range(at, at + (ramp[0] if ramp else 0) + 1))
    bounds = sorted({min(max(s, 0), steps) for s in changes})
    seconds = 0.0
    for start, stop in itertools.pairwise(bounds):
        factors = [straggler_factor(stragglers, r, start) for r in range(len(latency))]
        a = [x * f for x, f in zip(latency, factors, strict=True)]
        c = [x * f for x, f in zip(per_sample, factors, strict=True)]
        seconds += (stop - start) * global_batch / ideal_throughput(a, c, global_batch)
    return steps * global_batch / seconds


@dataclass(frozen=True)
class Bench:
    """One invocation's checked inputs: the emulated cluster, the training every variant shares,
    the stragglers (RANK, STEP, FACTOR[, RAMP]), the variants in the order given, and the rounds."""

    cluster: ClusterSpec
    base: TrainConfig
    stragglers: list[Straggler]
    variants: list[str]
    repeat: int
    keep_results: str | None = None  # a folder for each run's result.json (--keep-results)
    bound: bool = False  # time each worker alone at its batches: the measured bound (--bound)


def bench_cluster(args: argparse.Namespace) -> ClusterSpec:
    """The emulated (or, with --cpu-quotas, real) cluster the flags describe: one worker of
    each speed (of each quota where no speeds are given), its noise and curve."""
    if args.speeds is None:
        quotas = args.cpu_quotas.split(",") if args.cpu_quotas else []
        args.speeds = ",".join("1" for _ in quotas) or "1,1,2,4"
    if args.cpu_quotas is not None:  # real unequal workers: nothing to emulate
        args.emulate = False
    cluster = ClusterSpec.from_speeds(
        parse_speeds(args.speeds),
        name=f"bench-{args.speeds}",
        time_scale=args.time_scale,
        noise=args.noise,
        emulate=args.emulate,
        # the noise level's unless given
        **{k: getattr(args, k) for k in ("jitter", "pauses") if getattr(args, k) is not None},
    )
    for w in cluster.workers:
        w.curve = args.curve
    return cluster


def check_variants(variants: list[str]) -> None:
    """--variants: known kinds, each tag one its kind takes; a one-line ConfigError."""
    unknown = sorted({v.split("@")[0] for v in variants} - set(VARIANTS))
    if unknown:
        raise ConfigError(f"--variants: unknown {unknown}; choose from {list(VARIANTS)}")
    for v in variants:
        kind, *tags = v.split("@")
        bad = [t for t in tags if t not in VARIANT_TAGS or ONLY.get(t, kind) != kind]
        if bad:
            raise ConfigError(
                f"--variants: {v!r}: @{bad[0]} is not one of @micro, @profile (dynamic only), "
                "@history (static only)"
            )


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, Bench]:
    """The flags and what they describe, refused before anything runs: a ConfigError (or the
    config's ValidationError) naming the flag or field, checked in the order --repeat, the
    cluster, the training, --straggler, --variants."""
    args = parser().parse_args(argv)
    if args.repeat < 1:
        raise ConfigError(f"--repeat: must be >= 1 (got {args.repeat})")
    cluster = bench_cluster(args)
    precisions = args.precision.split(",")
    for p in precisions:
        if p not in get_args(PRECISION.annotation):
            raise ConfigError(f"--precision: {p!r} is not one of fp32, bf16, fp16, auto")
    set_hardware(cluster, args)
    knobs = {
        "precision": precisions[0],
        "recipe": recipe_flag(args, BUILTIN_RECIPES),
        "recipe_options": recipe_options(args),
        "steps": args.steps,
        "global_batch": args.global_batch,
        "rebalance_every": args.rebalance_every,
        "rebalance_threshold": args.rebalance_threshold,
        "strategy": args.strategy,
    }
    base = validated(TrainConfig, knobs, "train")
    check_job(cluster, base)
    check_bench_recipe(base)
    stragglers = [parse_straggler(s, cluster.world_size) for s in args.straggler]
    variants = [v for v in args.variants.split(",") if v]
    check_variants(variants)
    if args.launcher == "ray":
        variants = [name for v in variants for name in (v, f"{v}@ray")]
    if len(precisions) > 1:
        variants = [f"{v}@{p}" for v in variants for p in precisions]
    return args, Bench(
        cluster, base, stragglers, variants, args.repeat, args.keep_results, args.bound
    )


class Ideals(NamedTuple):
    """The bounds every variant is measured against, from the profile (see the module
    docstring): ideal samples/s, the all-reduce of one gradient, and the ideal that also pays
    that all-reduce every step."""

    samples_per_s: float
    allreduce_s: float
    with_allreduce_samples_per_s: float


def ideals(profile: Profile, bench: Bench) -> Ideals:
    """The run's Ideals (pure). The all-reduce is the one the plan prices
    (`planner.allreduce_of`), over the workers the balanced step uses
    (`perf.collective.measured_ring`: those whose fixed cost is shorter than that step; the
    others a plan need not launch)."""
    batch = bench.base.global_batch
    ideal = run_ideal(profile, batch, bench.base.steps, bench.stragglers)
    latency, _ = profile.step_models()
    used = sum(a < batch / ideal for a in latency)
    whole, fixed = planner.allreduce_of(profile)
    allreduce_s = measured_ring(whole, len(profile.ranks), used, fixed)
    return Ideals(ideal, allreduce_s, batch / (batch / ideal + allreduce_s))


def run_variant(
    name: str, round_: int, bench: Bench, profile: Profile, dataset: DatasetSpec, tmp: str
) -> tuple[dict, Plan, TrainConfig]:
    """One training run of variant `name` in round `round_`, with no gradient compression:
    (its result.json, its first plan over the ranks launched, its config). Planned from the
    profile where the variant needs one before its first step (`needs_profile`: 'static', and
    'dynamic@profile'), from the profile history as a second run assembles it where tagged
    @history (`history.history_profile`), else from the prior a first run has
    (`prior.published_prior`, else the equal split). Workers the plan drops (`Plan.dropped`)
    are not launched; the others keep their order."""
    base, *tags = name.split("@")
    launcher = "ray" if "ray" in tags else ""
    knobs = {"schedule": VARIANTS[base], "compression": "none"}
    if "micro" in tags:
        knobs["accumulate"] = "auto"
    if "profile" in tags:
        knobs["profile_first"] = True
    precision = [t for t in tags if t not in ("ray", *VARIANT_TAGS)]
    cfg = bench.base.model_copy(update=knobs | ({"precision": precision[0]} if precision else {}))
    whole = bench.cluster.model_copy(update={"launcher": launcher or "local"})
    if HISTORY in tags:
        profile = history_profile(profile, whole, cfg)
    elif not needs_profile(cfg):
        profile = published_prior(whole, cfg) or equal_prior(whole, cfg)
    planned = make_plan(profile, whole, cfg)
    if base == "fastest":
        planned = fastest_alone(planned, whole, cfg.global_batch)
    run_name = f"{name.replace('@', '-')}-{round_}"
    ran = run_plan(
        whole, planned, cfg, dataset, f"{tmp}/{run_name}", variant=name, stragglers=bench.stragglers
    )
    plan = RankMap(whole, planned).launched()[1]  # the plan the ranks launched started with
    if bench.keep_results:  # every step's records per rank, for reading a run step by step
        keep = Path(bench.keep_results) / f"{run_name}.json"
        keep.parent.mkdir(parents=True, exist_ok=True)
        keep.write_text(json.dumps({"result": ran.raw, "plan": plan.model_dump(mode="json")}))
    # start-up included; the first plan over the whole cluster (0 where not launched) too
    return {**ran.raw, "wall_s": ran.wall_s}, plan, cfg, planned.local_batches


def variant_figures(
    res: dict,
    plan: Plan,
    cfg: TrainConfig,
    ideal: Ideals,
    until_step: int,
    profile: Profile,
    charged_s: float,
) -> dict:
    """One run's figures (pure): throughput and efficiency against the ideals, end to end with
    `charged_s` of profile paid before it (`history.profile_charged_s`), where the ranks' time
    went, the plans and re-plans, and the error before `until_step` of the profile's model
    (the one the ideal is made of, whether the plan was or not)."""
    result = RunResult.model_validate({k: v for k, v in res.items() if k != "wall_s"})
    m = summarize(result, cfg.global_batch, cfg.target_accuracy, cfg.target_val_loss)
    m = end_to_end(m, res["wall_s"], charged_s)
    lead = res["ranks"][0]
    caps = plan.caps if plan.micro_count else None  # micro-batches: a_i for each
    launched = [r.step_model() for r in profile.ranks if r.worker not in plan.dropped]
    latency, per_sample = (list(x) for x in zip(*launched, strict=True))
    errors = compute_model_error(res, plan.local_batches, latency, per_sample, until_step, caps)
    efficiency = m.throughput_samples_per_s / ideal.samples_per_s
    return {
        "throughput_samples_per_s": m.throughput_samples_per_s,
        "ideal_samples_per_s": ideal.samples_per_s,
        "efficiency": efficiency,
        "efficiency_vs_ideal_with_allreduce": m.throughput_samples_per_s
        / ideal.with_allreduce_samples_per_s,
        "time_to_target_s": m.time_to_target_s,
        "final_accuracy": m.final_accuracy,
        "final_val_loss": m.final_val_loss,
        "evals": [e.model_dump(exclude_none=True) for e in result.ranks[0].evals],
        "initial_plan": plan.local_batches,  # of the ranks launched
        "dropped": plan.dropped,  # workers not launched (`planner.drop_from_launch`)
        "final_plan": lead["plans"][-1]["plan"],
        "replans": len(lead["replans"]),
        "plans": lead["plans"],  # every plan in force, from the step it came in
        "replan_log": lead["replans"],  # why: imbalance, predicted speedup, reverts
        "run_s": res["wall_s"],
        **{k: getattr(m, k) for k in WALL_FIGURES + E2E_FIGURES},
        "straggler_idle_fraction": m.straggler_idle_fraction,
        "busy_fraction": m.busy_fraction,
        "comm_fraction": m.comm_fraction,
        "data_wait_fraction": m.data_wait_fraction,
        "compute_model_error": errors,
        "steps_to_final_rate": steps_to_final_rate(res),
        "rate_curve": rate_curve(res),
        **at_run_pace(efficiency, errors),  # the host's pace during the run taken out
    }


def rate_curve(res: dict, window: int = 10) -> list[float]:
    """The run's samples/s at each step over the `window` steps up to it (rank 0's step times,
    every rank's samples), rounded for the JSON (pure)."""
    ranks = sorted(res["ranks"], key=lambda r: r["rank"])
    step_s = [x["step_s"] for x in ranks[0]["records"]]
    samples = [
        sum(s) for s in zip(*([x["batch"] for x in r["records"]] for r in ranks), strict=True)
    ]
    return [round(r, 1) for r in rolling_rate(step_s, samples, window)]


def run_rounds(
    bench: Bench, profile: Profile, ideal: Ideals, dataset: DatasetSpec, tmp: str
) -> dict[str, list[dict]]:
    """Every variant `bench.repeat` times, round by round (a slow spell of the host weighs on
    every variant alike), round r in the order `repeats.run_order` gives (the variants rotated
    by r: each runs first in turn): per variant, each run's figures in the order of the rounds,
    with its `round` and `position` in it (0: it ran first)."""
    until = min([bench.base.steps, *[s[1] for s in bench.stragglers]])
    runs: dict[str, list[dict]] = {name: [] for name in bench.variants}
    for round_ in range(bench.repeat):
        order = run_order(bench.variants, round_)
        print(f"round {round_}: {', '.join(order)} ({order[0]} first)", flush=True)
        planned = {}
        for position, name in enumerate(order):
            res, plan, cfg, planned[name] = run_variant(name, round_, bench, profile, dataset, tmp)
            charged = profile_charged_s(name, cfg, profile)
            figures = variant_figures(res, plan, cfg, ideal, until, profile, charged)
            runs[name].append(figures | {"round": round_, "position": position})
            print(
                f"round {round_} #{position + 1} {name}: "
                f"{figures['throughput_samples_per_s']:.0f} samples/s "
                f"(efficiency {figures['efficiency']:.2f}), plan {plan.local_batches}"
                f" -> {figures['final_plan']}",
                flush=True,
            )
        if bench.bound:  # each worker alone at the batches this round's plans gave it
            rates = solo_rates(bench, list(planned.values()), dataset, tmp, round_)
            for name, batches in planned.items():
                figures = runs[name][-1]
                figures |= bound_figures(
                    figures["throughput_samples_per_s"],
                    batches,
                    rates,
                    bench.base.global_batch,
                    ideal.allreduce_s,
                )
    return runs


def summary(
    args: argparse.Namespace, bench: Bench, profile: Profile, ideal: Ideals, results: dict
) -> dict:
    """The benchmark's JSON: the flags, what the profile measured, and every variant's figures."""
    return {
        "speeds": parse_speeds(args.speeds),
        "steps": args.steps,
        "recipe": args.recipe,
        "global_batch": args.global_batch,
        "stragglers": bench.stragglers,
        "time_scale": args.time_scale,
        "jitter": args.jitter,
        "pauses": args.pauses,
        "repeat": args.repeat,
        # the order each round ran the variants in (`repeats.run_order`): the first ran first
        "orders": [run_order(bench.variants, r) for r in range(bench.repeat)],
        "memory_caps": [w.memory_cap_batch for w in bench.cluster.workers],
        "cpu_quotas": [w.cpu_quota for w in bench.cluster.workers],
        "emulate": bench.cluster.emulate,
        "measured_speeds": [round(r.samples_per_s, 2) for r in profile.ranks],
        "allreduce_s": ideal.allreduce_s,
        "ideal_with_allreduce_samples_per_s": ideal.with_allreduce_samples_per_s,
        "variants": results,
    }


def main(argv: list[str] | None = None) -> int:
    args, bench = parse_args(argv)
    text_mb = check_bench_recipe(bench.base)  # a token recipe trains on the stdlib's source
    name = "stdlib" if text_mb else "digits"
    ray = args.launcher == "ray"
    with (
        digits_workspace(name, text_mb=text_mb) as (tmp, dataset),
        local_ray(bench.cluster.world_size, args.ray_address, enabled=ray) as address,
    ):
        if ray:
            bench = replace(
                bench, cluster=bench.cluster.model_copy(update={"ray_address": address})
            )
        profile = measure_profile(bench.cluster, dataset, bench.base, f"{tmp}/profile")
        ideal = ideals(profile, bench)
        runs = run_rounds(bench, profile, ideal, dataset, tmp)
    out = summary(args, bench, profile, ideal, with_speedups(runs))
    print_table(out)
    write_json(args.json_path, out)
    if args.plot:
        curves = {name: r["rate_curve"] for name, r in out["variants"].items()}
        title = f"rate against steps: {args.speeds}" + (
            f", CPU quotas {args.cpu_quotas}" if args.cpu_quotas else ""
        )
        print(f"wrote {rate_curves(curves, Path(args.plot), title)}")
    return 0
