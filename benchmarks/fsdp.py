"""`hetflow bench fsdp`: sharded (FSDP2) against DDP on emulated mixed workers, in one run.

    hetflow bench fsdp --speeds 1,1,2,4 --steps 16 --json fsdp.json

A profile under each strategy (as a run under it profiles: the compute probe steps the model
through DDP or sharded), then four runs of the same gpt (small by default, so that it fits
both) on the same dataset and seed: DDP and fsdp, each with the equal split and with the plan
sized by its strategy's profile (`proportional`), run in the order ddp-equal, fsdp-equal,
ddp-planned, fsdp-planned. Per run: steady throughput, and per rank the bytes of parameters,
gradients and optimizer state held (`state_bytes`), the peak resident memory and the bytes sent
per step. Ratios: fsdp's state and peak memory over DDP's (equal split), fsdp's throughput over
DDP's (equal split, and planned), and the planned split's throughput over the equal split's
under each strategy (the gain from the plan). Figures measured: docs/measurements/fsdp.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from hetflow.cli.args import Parser, add_recipe_arg, recipe_flag, recipe_options
from hetflow.config import (
    BUILTIN_RECIPES,
    ClusterSpec,
    TrainConfig,
    check_job,
    parse_speeds,
    validated,
)
from hetflow.records import RunResult
from hetflow.training.launch.run import measure_profile, run_plan
from hetflow.training.metrics import summarize
from hetflow.training.plan.planner import make_plan

from benchmarks import check_bench_recipe, digits_workspace, wide_console, write_json

RUNS = (("ddp", "equal"), ("fsdp", "equal"), ("ddp", "proportional"), ("fsdp", "proportional"))
SMALL_GPT = "n_layer=2,n_head=2,n_embd=128,context=32"
MB = 2**20


def parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="hetflow bench fsdp",
        description="sharded (fsdp) against DDP: memory per rank, throughput, the plan's gain",
        formatter_class=argparse.HelpFormatter,
    )
    p.add_argument("--speeds", default="1,1,2,4", help="relative speeds (default: 1,1,2,4)")
    p.add_argument("--steps", type=int, default=16, help="steps per run (default: 16)")
    p.add_argument("--global-batch", type=int, default=32, dest="global_batch")
    add_recipe_arg(p, "gpt", BUILTIN_RECIPES)
    p.add_argument(
        "--no-emulate",
        dest="emulate",
        action="store_false",
        help="no time dilation: every worker at this host's own pace (what each strategy "
        "costs the host itself)",
    )
    p.add_argument("--json", dest="json_path")
    return p


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, ClusterSpec, TrainConfig]:
    """The flags, checked before anything runs; gpt's options default to SMALL_GPT."""
    args = parser().parse_args(argv)
    if recipe_flag(args, BUILTIN_RECIPES) == "gpt" and not args.recipe_option:
        args.recipe_option = SMALL_GPT.split(",")
    speeds = parse_speeds(args.speeds)
    cluster = ClusterSpec.from_speeds(speeds, name=f"bench-{args.speeds}", emulate=args.emulate)
    knobs = {
        "recipe": recipe_flag(args, BUILTIN_RECIPES),
        "recipe_options": recipe_options(args),
        "steps": args.steps,
        "global_batch": args.global_batch,
        "eval_every": args.steps,
        "checkpoint_every": args.steps,
        "target_accuracy": None,
        "compression": "none",
    }
    base = validated(TrainConfig, knobs, "train")
    for strategy in ("ddp", "fsdp"):
        check_job(cluster, base.model_copy(update={"strategy": strategy}))
    return args, cluster, base


def run_figures(raw: dict, cfg: TrainConfig, plan: list[int], wall_s: float) -> dict:
    """One run's figures (pure): throughput, and per rank state bytes, peak RSS, bytes/step."""
    result = RunResult.model_validate(raw)
    m = summarize(result, cfg.global_batch, cfg.target_accuracy, cfg.target_val_loss)
    ranks = result.ranks
    return {
        "plan": plan,
        "throughput_samples_per_s": m.throughput_samples_per_s,
        "state_bytes": [r.state_bytes for r in ranks],
        "peak_rss_bytes": [r.peak_rss_bytes for r in ranks],
        "peak_device_bytes": [r.peak_device_bytes for r in ranks],
        "bytes_per_step": [r.bytes_total / max(len(r.records), 1) for r in ranks],
        "final_val_loss": m.final_val_loss,
        "params": ranks[0].params,
        "run_s": wall_s,
    }


def ratios(runs: dict[str, dict]) -> dict[str, float]:
    """fsdp over DDP and planned over equal (pure), from `runs` keyed 'STRATEGY-SCHEDULE'."""

    def mean(key: str, name: str) -> float:
        return statistics.mean(runs[name][key])

    def tp(name: str) -> float:
        return runs[name]["throughput_samples_per_s"]

    return {
        "state_bytes_fsdp_over_ddp": mean("state_bytes", "fsdp-equal")
        / mean("state_bytes", "ddp-equal"),
        "peak_rss_fsdp_over_ddp": mean("peak_rss_bytes", "fsdp-equal")
        / mean("peak_rss_bytes", "ddp-equal"),
        "throughput_fsdp_over_ddp_equal": tp("fsdp-equal") / tp("ddp-equal"),
        "throughput_fsdp_over_ddp_planned": tp("fsdp-proportional") / tp("ddp-proportional"),
        "planned_over_equal_ddp": tp("ddp-proportional") / tp("ddp-equal"),
        "planned_over_equal_fsdp": tp("fsdp-proportional") / tp("fsdp-equal"),
    }


def print_table(out: dict) -> None:
    from rich.table import Table

    table = Table(title=f"fsdp vs ddp, speeds {out['speeds']}, {out['recipe']}")
    table.add_column("run")
    for col in ("plan", "samples/s", "state MB per rank", "peak RSS MB per rank", "MB sent/step"):
        table.add_column(col, justify="right")
    for name, r in out["runs"].items():
        table.add_row(
            name,
            str(r["plan"]),
            f"{r['throughput_samples_per_s']:.1f}",
            " ".join(f"{b / MB:.2f}" for b in r["state_bytes"]),
            " ".join(f"{b / MB:.0f}" for b in r["peak_rss_bytes"]),
            f"{statistics.mean(r['bytes_per_step']) / MB:.2f}",
        )
    console = wide_console(110)
    console.print(table)
    for k, v in out["ratios"].items():
        console.print(f"{k}: {v:.3f}")


def main(argv: list[str] | None = None) -> int:
    args, cluster, base = parse_args(argv)
    text_mb = check_bench_recipe(base)
    runs: dict[str, dict] = {}
    with digits_workspace("stdlib" if text_mb else "digits", text_mb=text_mb) as (tmp, data):
        profiles = {
            s: measure_profile(cluster, data, base.model_copy(update={"strategy": s}), f"{tmp}/{s}")
            for s in ("ddp", "fsdp")
        }
        for strategy, schedule in RUNS:
            name = f"{strategy}-{schedule}"
            cfg = base.model_copy(update={"strategy": strategy, "schedule": schedule})
            plan = make_plan(profiles[strategy], cluster, cfg)
            ran = run_plan(cluster, plan, cfg, data, f"{tmp}/{name}", variant=name)
            runs[name] = run_figures(ran.raw, cfg, plan.local_batches, ran.wall_s)
            print(f"{name}: {runs[name]['throughput_samples_per_s']:.1f} samples/s", flush=True)
    out = {
        "speeds": parse_speeds(args.speeds),
        "emulated": args.emulate,
        "recipe": base.recipe,
        "recipe_options": base.recipe_options,
        "steps": base.steps,
        "global_batch": base.global_batch,
        "measured_speeds": {
            s: [round(r.samples_per_s, 2) for r in p.ranks] for s, p in profiles.items()
        },
        "runs": runs,
        "ratios": ratios(runs),
    }
    print_table(out)
    write_json(args.json_path, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
