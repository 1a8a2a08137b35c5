"""`hetflow bench diloco`: DiLoCo rounds against synchronous DDP at its best fixed setting.

    hetflow bench diloco --json diloco.json
    hetflow bench diloco --links 0.1 --variants sync,auto,diloco,diloco@int8,diloco@stale1
    hetflow bench diloco --links 0.1 --sync-compression bf16 --target-accuracy 0.95 --seeds 3

Every variant trains the same recipe (default digits-cnn) on the same 4 mixed emulated
workers (presets t4, t4, v100, a100), each behind a link of the given bandwidth and the
cross-region latency (`emulation.links`), for the same samples (`--steps` synchronous steps of
`--global-batch`), from each of `--seeds` training seeds. Each is planned from the presets'
published ratios, so none pays a profile. `sync`: DDP on the static plan at a setting chosen
ahead and stated, `--sync-compression` (none by default; fp16 or bf16), no trials; `sync@none`:
uncompressed whatever that flag says; `auto`: DDP with compression 'auto', its trials in its
time, a row of its own. `diloco`: rounds of `--round-steps` steps' worth of samples, inner steps
in proportion to each worker's speed; `@int8` and `@bf16` send the outer change so; `@staleN`
applies each round's average N rounds late; `@dynamic` re-plans the rounds' shares from their
measured times (the re-balancer). Per run: end to end (launch, trials, evaluation and every
step until the evaluation that met the target), final quality, bytes sent per sample. Per
link and variant (`diloco_figures`): the time to the target's median with its min-max, the
speed-up over `sync` paired within a seed and round, and the final quality's median and spread
across seeds. Each round of a seed runs the variants in a rotated order (`repeats.run_order`).
The target is fixed before the run and kept in the JSON: `--target-accuracy` (test accuracy,
default 0.95) on the digits; a token recipe (gpt) trains on the standard library's source and
is measured by validation loss instead: `--target-val-loss`, which it needs, met by the first
evaluation at or below it, the final quality its last val_loss.
Figures measured: docs/measurements/diloco.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hetflow.cli.args import Parser, add_recipe_arg, recipe_flag, recipe_options
from hetflow.config import (
    BUILTIN_RECIPES,
    ClusterSpec,
    ConfigError,
    TrainConfig,
    WorkerSpec,
    check_job,
)
from hetflow.emulation.links import LINKS
from hetflow.repeats import run_order
from hetflow.training.launch.run import run_plan
from hetflow.training.metrics import end_to_end, summarize
from hetflow.training.plan.planner import make_plan
from hetflow.training.plan.prior import published_prior

from benchmarks import check_bench_recipe, digits_workspace, write_json
from benchmarks.diloco_figures import progress_line, summarize_links, table

PRESETS = ("t4", "t4", "v100", "a100")
LATENCY_MS = LINKS["cross-region"].latency_ms
ACCURACY_TARGET = 0.95  # --target-accuracy's default, for a recipe that evaluates accuracy
SYNC_COMPRESSION = ("none", "fp16", "bf16")  # sync's fixed settings: no trials


def parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="hetflow bench diloco",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.HelpFormatter,  # its help states the defaults itself
    )
    p.add_argument(
        "--links", default="10,1,0.1", help="link bandwidths, Gbit/s, comma list (default 10,1,0.1)"
    )
    p.add_argument(
        "--latency-ms",
        type=float,
        default=LATENCY_MS,
        dest="latency_ms",
        help=f"latency per collective, ms (default {LATENCY_MS:g}: the cross-region preset)",
    )
    p.add_argument(
        "--variants",
        default="sync,diloco",
        help="comma list: sync (DDP at --sync-compression, no trials), sync@none (no "
        "compression), auto (DDP with compression 'auto', its trials in its time), diloco, "
        "diloco@int8, diloco@bf16, diloco@staleN, diloco@dynamic (the rounds' shares "
        "re-planned from their times) (default sync,diloco)",
    )
    p.add_argument(
        "--sync-compression",
        dest="sync_compression",
        choices=SYNC_COMPRESSION,
        default="none",
        help="sync's gradient compression, fixed before the run: none, or a 16-bit method "
        "(default none)",
    )
    p.add_argument("--steps", type=int, default=160, help="synchronous steps' worth of samples")
    p.add_argument("--global-batch", type=int, default=128, dest="global_batch")
    p.add_argument("--round-steps", type=int, default=16, dest="round_steps")
    _add_targets(p)
    p.add_argument("--time-scale", type=float, default=4.0, dest="time_scale")
    p.add_argument("--repeat", type=int, default=1, help="rounds of every run (default 1)")
    p.add_argument(
        "--straggler",
        help="a transient straggler, WORKER:FROM:TO:FACTOR: worker WORKER (0-3) runs FACTOR "
        "times slower from synchronous step FROM to TO (a round's index under diloco: the "
        "round holding that step) (default: none)",
    )
    p.add_argument("--seed", type=int, default=0, help="the first training seed (default 0)")
    p.add_argument(
        "--seeds",
        type=int,
        default=3,
        help="training seeds, from --seed on: every run once per seed (default 3)",
    )
    p.add_argument("--json", help="write every run's figures and evaluations here")
    add_recipe_arg(p, "digits-cnn", BUILTIN_RECIPES)
    return p


def _add_targets(p: argparse.ArgumentParser) -> None:
    """The target a run is timed to, fixed before it and kept in the JSON."""
    p.add_argument(
        "--target-accuracy",
        "--target",
        type=float,
        dest="target_accuracy",
        help=f"test accuracy, fixed before the run (default {ACCURACY_TARGET:g}; not for gpt)",
    )
    p.add_argument(
        "--target-val-loss",
        type=float,
        dest="target_val_loss",
        help="validation loss, fixed before the run, for a token recipe (gpt), which needs it: "
        "the time to target is to the first evaluation at or below it",
    )


def variant_config(name: str, base: TrainConfig, sync_compression: str = "none") -> TrainConfig:
    """The config of variant `name` over `base` (`sync` at `sync_compression`); a one-line
    ConfigError naming --variants."""
    head, *tags = name.split("@")
    if head == "sync" and tags in ([], ["none"]):  # a fixed setting: no trials
        return base.model_copy(update={"compression": "none" if tags else sync_compression})
    if head == "auto" and not tags:  # compression 'auto': its trials in its time
        return base.model_copy(update={"compression": "auto"})
    if head != "diloco":
        raise ConfigError(
            f"--variants: {name!r} is not sync[@none], auto or diloco[@int8|@bf16|@staleN|@dynamic]"
        )
    diloco = base.diloco.model_copy()
    for tag in tags:
        if tag in ("int8", "bf16"):
            diloco.send = tag
        elif tag == "dynamic":
            base = base.model_copy(update={"schedule": "dynamic"})
        elif tag.startswith("stale") and tag[5:].isdigit():
            diloco.staleness = int(tag[5:])
        else:
            raise ConfigError(f"--variants: {name!r}: unknown tag {tag!r}")
    return base.model_copy(update={"strategy": "diloco", "diloco": diloco})


def targets(accuracy: float | None, val_loss: float | None, tokens: bool) -> dict:
    """TrainConfig's target fields from --target-accuracy and --target-val-loss, fixed before
    the run: a token recipe (the benchmark's text) is measured by val_loss, any other (the
    digits) by test accuracy; a one-line ConfigError naming the flag that is missing or does
    not fit."""
    if tokens and accuracy is not None:
        raise ConfigError(
            "--target-accuracy: test accuracy, which a token recipe (gpt) does not evaluate; "
            "give --target-val-loss"
        )
    if tokens and val_loss is None:
        raise ConfigError("--target-val-loss: a token recipe (gpt) needs it")
    if not tokens and val_loss is not None:
        raise ConfigError(
            "--target-val-loss: only for a token recipe (gpt); the digits' recipes are "
            "measured by --target-accuracy (test accuracy)"
        )
    if accuracy is not None and not 0 < accuracy <= 1:
        raise ConfigError(f"--target-accuracy: a fraction in (0, 1] (got {accuracy:g})")
    if tokens:
        return {"target_accuracy": None, "target_val_loss": val_loss}
    return {"target_accuracy": ACCURACY_TARGET if accuracy is None else accuracy}


def cluster_at(gbps: float, latency_ms: float, time_scale: float) -> ClusterSpec:
    """The 4 preset workers behind links of `gbps` and `latency_ms`."""
    workers = [
        WorkerSpec(name=f"w{i}-{p}", preset=p, link_gbps=gbps, link_latency_ms=latency_ms)
        for i, p in enumerate(PRESETS)
    ]
    return ClusterSpec(name=f"diloco-{gbps:g}gbps", workers=workers, time_scale=time_scale)


def parse_straggler(text: str | None) -> tuple[int, int, int, float] | None:
    """--straggler's WORKER:FROM:TO:FACTOR; a one-line ConfigError naming it."""
    if not text:
        return None
    try:
        w, start, end, factor = text.split(":")
        out = (int(w), int(start), int(end), float(factor))
    except ValueError:
        raise ConfigError(f"--straggler: {text!r} is not WORKER:FROM:TO:FACTOR") from None
    if not (0 <= out[0] < len(PRESETS) and 0 <= out[1] < out[2] and out[3] > 0):
        raise ConfigError(f"--straggler: {text!r}: a worker 0-3, FROM < TO, FACTOR > 0")
    return out


def stragglers_of(straggler, cfg: TrainConfig) -> list[tuple[int, int, float]]:
    """The (worker, step, factor) entries of a transient straggler, in the loop's steps: a
    round's index under diloco."""
    if straggler is None:
        return []
    w, start, end, factor = straggler
    per = cfg.diloco.round_steps if cfg.strategy == "diloco" else 1
    return [(w, start // per, factor), (w, max(end // per, start // per + 1), 1.0)]


def last_more(ran) -> dict[str, float]:
    """The last evaluation's figures beyond the named ones (a classifier's `test_loss`)."""
    evals = ran.result.lead.evals
    return evals[-1].more if evals else {}


def one_run(
    cfg: TrainConfig, cluster: ClusterSpec, dataset, run_dir: str, name: str, straggler=None
) -> dict:
    """One run from its published-ratio plan to its figures, every cost counted."""
    plan = make_plan(published_prior(cluster, cfg), cluster, cfg)
    slow = stragglers_of(straggler, cfg)
    ran = run_plan(cluster, plan, cfg, dataset, run_dir, variant=name, stragglers=slow)
    m = summarize(ran.result, cfg.global_batch, cfg.target_accuracy, cfg.target_val_loss)
    m = end_to_end(m, ran.wall_s, 0.0)
    samples = sum(rec.batch for r in ran.result.ranks for rec in r.records)
    return {
        "variant": name,
        "plan": plan.local_batches,
        "end_to_end_time_to_target_s": m.end_to_end_time_to_target_s,
        "end_to_end_s": m.end_to_end_s,
        "final_accuracy": m.final_accuracy,
        "final_val_loss": m.final_val_loss,
        # a classifier's mean cross-entropy on the test split: finer than its accuracy
        "final_test_loss": last_more(ran).get("test_loss"),
        "comm_bytes_total": m.comm_bytes_total,
        "bytes_per_sample": m.comm_bytes_total / samples if samples else None,
        "wait_fraction": m.comm_fraction + m.straggler_idle_fraction,
        "rounds": m.rounds,
        "replans": m.replans,
        "inner_steps_per_round": [r.inner_steps_per_round for r in m.ranks],
        "trials_s": m.trials_s,
        # each evaluation (its wall_s: since submit), so the JSON gives the time to any target
        "evals": [e.model_dump(exclude_none=True) for e in ran.result.lead.evals],
    }


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[float], list[int]]:
    """The flags, the links (Gbit/s) and the training seeds; a one-line ConfigError naming the
    flag, before anything runs."""
    a = parser().parse_args(argv)
    try:
        links = [float(x) for x in a.links.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--links: {a.links!r} is not a comma list of Gbit/s") from None
    if not links or not all(0 < g < float("inf") for g in links):
        raise ConfigError(f"--links: {a.links!r}: each bandwidth a number of Gbit/s above 0")
    if a.repeat < 1:
        raise ConfigError(f"--repeat: at least 1 (got {a.repeat})")
    if a.seeds < 1:
        raise ConfigError(f"--seeds: at least 1 (got {a.seeds})")
    return a, links, list(range(a.seed, a.seed + a.seeds))


def schedule(configs: list[str], seeds: list[int], repeat: int) -> list[tuple[int, int, list]]:
    """(round, seed, the variants in the order they run) for every round of every seed (pure):
    the k-th runs them rotated by k (`repeats.run_order`), so each runs first in turn."""
    groups = [(r, seed) for r in range(repeat) for seed in seeds]
    return [(r, seed, run_order(configs, k)) for k, (r, seed) in enumerate(groups)]


def main(argv: list[str] | None = None) -> int:
    a, links, seeds = parse_args(argv)
    knobs = {
        "recipe": recipe_flag(a, BUILTIN_RECIPES),
        "recipe_options": recipe_options(a),
        "steps": a.steps,
        "global_batch": a.global_batch,
        "schedule": "proportional",
        "diloco": {"round_steps": a.round_steps},
    }
    text_mb = check_bench_recipe(TrainConfig(**knobs))  # a token recipe: the stdlib's source
    goal = targets(a.target_accuracy, a.target_val_loss, text_mb is not None)
    base = TrainConfig(**knobs, **goal)
    names = [v.strip() for v in a.variants.split(",") if v.strip()]
    configs = {v: variant_config(v, base, a.sync_compression) for v in names}
    for cfg in configs.values():
        check_job(cluster_at(links[0], a.latency_ms, a.time_scale), cfg)
    straggler = parse_straggler(a.straggler)
    plan = schedule(list(configs), seeds, a.repeat)
    rows: dict[float, dict[str, list[dict]]] = {g: {v: [] for v in configs} for g in links}
    with digits_workspace("diloco", text_mb=text_mb) as (tmp, dataset):
        for round_, seed, order in plan:
            print(f"round {round_}, seed {seed}: {', '.join(order)} ({order[0]} first)")
            for gbps in links:
                cluster = cluster_at(gbps, a.latency_ms, a.time_scale)
                for position, name in enumerate(order):
                    cfg = configs[name].model_copy(update={"seed": seed})
                    tag = f"{name.replace('@', '-')}-{gbps:g}-{round_}-s{seed}"
                    fig = one_run(cfg, cluster, dataset, str(Path(tmp) / tag), name, straggler)
                    where = {"gbps": gbps, "round": round_, "seed": seed, "position": position}
                    rows[gbps][name].append(fig | where)
                    print(progress_line(gbps, name, round_, fig | where), flush=True)
    summary = summarize_links(rows)
    print(table(summary))
    out = {"args": vars(a), "targets": goal, "sync_compression": a.sync_compression}
    orders = [{"round": r, "seed": s, "order": o} for r, s, o in plan]
    write_json(a.json, out | {"seeds": seeds, "orders": orders, "summary": summary, "runs": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
