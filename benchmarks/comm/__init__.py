"""`hetflow bench comm`: gradient compression and local SGD on an emulated link, in one run.

    hetflow bench comm --link-gbps 1 --json comm.json
    hetflow bench comm --methods none,fp16,topk:0.01 --link-gbps 0 --steps 30   # loopback

Every method trains the same recipe (default `digits-wide-mlp`) from the same seed on 4 equal
emulated workers behind the given link. Per method: bytes per step after its warm-up and
`compression_ratio` against `none`, rank 0's step, compute and comm time, the final loss and
accuracy and its change against `none`; `chosen` and `trials`, what `auto` picks on that link
by its trials (trained too if it is not among `--methods`). Every figure: docs/benchmarks.md;
figures measured: docs/measurements/comm.md.
"""

from __future__ import annotations

import argparse
import re
import time
from dataclasses import dataclass
from typing import NamedTuple

from hetflow.cli.args import Parser, add_recipe_arg, recipe_flag, recipe_options
from hetflow.config import (
    BUILTIN_RECIPES,
    ClusterSpec,
    ConfigError,
    DatasetSpec,
    TrainConfig,
    check_job,
    link_cluster,
    validated,
)
from hetflow.records import CompressionMethod, Plan
from hetflow.repeats import run_order
from hetflow.training.comm import DENSE_WARMUP_STEPS, method_warmup_steps
from hetflow.training.launch.run import run_plan
from hetflow.training.plan.balance import equal_batches
from hetflow.training.plan.compression import auto_candidates

from benchmarks import check_bench_recipe, digits_workspace, write_json
from benchmarks.comm.figures import method_metrics, method_results, paired_cuts, quality
from benchmarks.comm.table import print_tables

DEFAULT_METHODS = "none,fp16,bf16,powersgd:4,topk:0.01,localsgd:4"
WORLD = 4


def parse_methods(text: str) -> list[CompressionMethod]:
    """The comma list of `--methods`, each parsed once; ConfigError naming `--methods`."""
    names = [m.strip() for m in text.split(",") if m.strip()]
    if not names:
        raise ConfigError("--methods: at least one method is needed")
    methods = []
    for m in names:
        if m == "auto":
            raise ConfigError("--methods: 'auto' is reported as `chosen`; list concrete methods")
        try:
            methods.append(CompressionMethod.parse(m))
        except ValueError as e:
            raise ConfigError(f"--methods: {e}") from None
    if len(set(methods)) != len(methods):
        raise ConfigError(f"--methods: a method appears twice ({text!r})")
    return methods


def _slug(method: CompressionMethod) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", str(method))


def _parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="hetflow bench comm",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.HelpFormatter,  # its help states the defaults itself
    )
    p.add_argument(
        "--methods", default=DEFAULT_METHODS, help=f"comma list (default {DEFAULT_METHODS})"
    )
    p.add_argument(
        "--link-gbps",
        type=float,
        default=1.0,
        dest="link_gbps",
        help="emulated link bandwidth per worker, Gbit/s; 0 = loopback (default 1)",
    )
    p.add_argument(
        "--latency-ms",
        type=float,
        default=0.0,
        dest="latency_ms",
        help="emulated latency per collective, ms (default 0)",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=None,
        dest="time_scale",
        help="the emulated workers' time scale, the link's cost on the same clock "
        "(default: the cluster's, 8)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=59,
        help="optimizer steps per method (default 59: local SGD with H=4 and 10 warm-up "
        "steps then ends on an averaging step)",
    )
    add_recipe_arg(p, "digits-wide-mlp", BUILTIN_RECIPES)
    p.add_argument("--global-batch", type=int, default=128, dest="global_batch")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds of runs (every method once per round); times are the medians and "
        "the chosen method's cut against none is given per round (default 1)",
    )
    p.add_argument(
        "--allow-local-sgd",
        action="store_true",
        dest="allow_local_sgd",
        help="let auto also try localsgd:4 (train.allow_local_sgd)",
    )
    p.add_argument("--json", dest="json_path")
    p.add_argument("--work-dir", dest="work_dir", help="keep run directories (logs, results) here")
    return p


@dataclass(frozen=True)
class Bench:
    """One invocation's checked inputs: the methods in the order given, the emulated cluster,
    the training every method shares, the dense warm-up left out of the times (`skip`), and the
    rounds."""

    methods: list[CompressionMethod]
    cluster: ClusterSpec
    base: TrainConfig
    skip: int
    repeat: int


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, Bench]:
    """The flags and what they describe, refused before anything runs: a one-line ConfigError
    naming the flag or field, checked in the order --methods, --link-gbps, --latency-ms,
    --repeat, the training."""
    args = _parser().parse_args(argv)
    methods = parse_methods(args.methods)
    if args.link_gbps < 0 or args.link_gbps != args.link_gbps:
        raise ConfigError(f"--link-gbps: must be >= 0 (0 = loopback) (got {args.link_gbps})")
    if args.latency_ms < 0:
        raise ConfigError(f"--latency-ms: must be >= 0 (got {args.latency_ms})")
    if args.repeat < 1:
        raise ConfigError(f"--repeat: must be >= 1 (got {args.repeat})")
    if args.time_scale is not None and not args.time_scale >= 1:
        raise ConfigError(f"--time-scale: must be >= 1 (got {args.time_scale})")
    cluster = link_cluster(args.link_gbps, args.latency_ms, time_scale=args.time_scale)
    knobs = {
        "recipe": recipe_flag(args, BUILTIN_RECIPES),
        "recipe_options": recipe_options(args),
        "steps": args.steps,
        "global_batch": args.global_batch,
        "seed": args.seed,
        "schedule": "equal",
        "compression": "none",
        "rebalance_every": args.steps,
        "eval_every": args.steps,
        "target_accuracy": None,
        "allow_local_sgd": args.allow_local_sgd,
    }
    knobs["checkpoint_every"] = args.steps  # no checkpoint inside the timed run
    base = validated(TrainConfig, knobs, "train")
    check_job(cluster, base)
    check_bench_recipe(base)
    skip = min(DENSE_WARMUP_STEPS, max(1, args.steps - 1))
    return args, Bench(methods, cluster, base, skip, args.repeat)


class Auto(NamedTuple):
    """What `auto` picks on this link by trials, why, and the trials' table."""

    method: CompressionMethod
    reason: str
    trials: list[dict]


def trial_and_choose(bench: Bench, dataset: DatasetSpec, tmp: str) -> Auto:
    """Pick as `auto` does at the start of a run long enough for trials to pay: a one-step run
    with compression `auto`, whose workers try every candidate (`auto_candidates`; no probe of
    the first, `Plan.compression_probe`) on the emulated link and keep the one with the
    shortest measured step (`hetflow.training.loop.trials`)."""
    cfg = bench.base.model_copy(
        update={"compression": "auto", "steps": 1, "eval_every": 1, "checkpoint_every": 1}
    )
    plan = Plan(
        local_batches=equal_batches(WORLD, cfg.global_batch),
        compression_reason="hetflow bench comm: trials",
        compression_candidates=auto_candidates(cfg, bench.cluster),
        compression_probe=False,  # every candidate tried, as on a run long enough to pay
    )
    ran = run_plan(bench.cluster, plan, cfg, dataset, f"{tmp}/comm-auto", variant="auto")
    trials = ran.result.lead.trials
    rows = [t.model_dump(mode="json") | {"method": str(t.method)} for t in trials.trials]
    said = ", ".join(
        f"{r['method']} {r['step_s'] * 1e3:.0f} ms" if r["step_s"] else f"{r['method']} failed"
        for r in rows
    )
    print(f"trials: {said} -> auto picks {trials.chosen}", flush=True)
    return Auto(trials.chosen, trials.reason, rows)


def _train_method(
    method: CompressionMethod, round_: int, bench: Bench, dataset: DatasetSpec, tmp: str
) -> dict:
    """One training run of `method` (round `round_`) and its figures, timed from after its
    warm-up."""
    label = str(method)  # the method's key in the JSON and the table
    cfg = bench.base.model_copy(update={"compression": label})
    plan = Plan(
        local_batches=equal_batches(WORLD, cfg.global_batch),
        compression=method,
        compression_reason="hetflow bench comm",
    )
    run_dir = f"{tmp}/comm-{_slug(method)}-{round_}"
    ran = run_plan(bench.cluster, plan, cfg, dataset, run_dir, variant=label)
    res, wall = ran.raw, ran.wall_s
    timed_from = min(max(bench.skip, method_warmup_steps(method)), max(1, cfg.steps - 1))
    r = {
        **method_metrics(res, cfg.global_batch, timed_from),
        "wall_s": wall,
        "timed_from_step": timed_from,
    }
    print(
        f"{label}: {r['bytes_per_step'] / 1e6:.3f} MB/step, step {r['step_time_s'] * 1e3:.0f} ms "
        f"(comm {r['comm_time_s'] * 1e3:.0f} ms), {quality(r)}, {wall:.0f}s",
        flush=True,
    )
    return r


def run_rounds(
    methods: list[CompressionMethod], bench: Bench, dataset: DatasetSpec, tmp: str
) -> dict[str, list[dict]]:
    """Every method `bench.repeat` times, round by round (every method once per round, round r
    in the order `repeats.run_order` gives: the methods rotated by r, each first in turn): per
    method, each run's figures in the order of the rounds, with its `position` in its round
    (0: it ran first)."""
    rounds: dict[str, list[dict]] = {str(m): [] for m in methods}
    for round_ in range(bench.repeat):
        order = run_order(methods, round_)
        print(f"round {round_}: {', '.join(map(str, order))} ({order[0]} first)", flush=True)
        for position, method in enumerate(order):
            r = _train_method(method, round_, bench, dataset, tmp)
            rounds[str(method)].append(r | {"round": round_, "position": position})
    return rounds


def summary(
    args: argparse.Namespace,
    bench: Bench,
    results: dict[str, dict],
    auto: Auto,
    wall_s: float,
    orders: list[list[str]] | None = None,
) -> dict:
    """The benchmark's JSON (pure): every method's figures, what `auto` picked and what that
    saved, the order each round ran the methods in (`orders`), and the flags."""
    picked = str(auto.method)
    vs_none = results[picked].get("step_time_vs_none")
    return {
        "methods": results,
        "chosen": picked,
        "chosen_reason": auto.reason,
        "chosen_by": "trials",
        "trials": auto.trials,
        "chosen_step_time_cut": 1 - vs_none if vs_none is not None else None,
        "chosen_step_time_cut_runs": paired_cuts(results, picked),
        "repeat": args.repeat,
        "orders": orders or [],
        "link_gbps": args.link_gbps or None,
        "time_scale": bench.cluster.time_scale,
        "latency_ms": args.latency_ms,
        "recipe": args.recipe,
        "params": results[picked]["params"],  # the same model for every method
        "world": WORLD,
        "steps": args.steps,
        "timed_from_step": bench.skip,
        "warmup_steps": DENSE_WARMUP_STEPS,
        "global_batch": args.global_batch,
        "seed": args.seed,
        "bench_wall_s": wall_s,
    }


def main(argv: list[str] | None = None) -> int:
    args, bench = parse_args(argv)
    t_start = time.perf_counter()
    text_mb = check_bench_recipe(bench.base)  # a token recipe trains on the stdlib's source
    name = "comm-stdlib" if text_mb else "comm-digits"
    with digits_workspace(name, args.work_dir, text_mb) as (tmp, dataset):
        auto = trial_and_choose(bench, dataset, tmp)
        extra = [auto.method] if auto.method not in bench.methods else []
        rounds = run_rounds(bench.methods + extra, bench, dataset, tmp)
    results = method_results(rounds, WORLD)
    orders = [list(map(str, run_order(bench.methods + extra, r))) for r in range(bench.repeat)]
    out = summary(args, bench, results, auto, time.perf_counter() - t_start, orders)
    print_tables(out)
    write_json(args.json_path, out)
    return 0
