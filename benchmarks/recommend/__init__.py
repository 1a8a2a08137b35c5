"""`hetflow bench recommend`: recommend's predictions against runs, real or emulated.

    hetflow bench recommend --cpu-quotas --stand-in digits-cnn --global-batch 512
    hetflow bench recommend --json reccheck.json
    hetflow bench recommend --candidates g4dn.xlarge:2,p3.2xlarge:2 --deadline-h 2 --repeat 3

With `--cpu-quotas`, the check of the predictor on real workers whose speeds it did not shape
(`benchmarks.recommend.quotas`). Without it, a self-consistency check: the emulated workers'
speeds and links are set from recommend's own curves and all-reduce, so what it measures is the
rest of the prediction (the balanced step, what a step costs beyond compute and all-reduce), not
the curves. For one job (`--job-recipe`, `--global-batch`, `--steps`) and candidates whose GPUs
have presets (at most `--max-ranks` GPUs in any mix run), it asks recommend for the least cost
within the deadline, builds the naive choices (`figures.naive_mixes`), and runs each as an
emulated cluster on this host for `--run-steps` steps of a stand-in recipe (`--stand-in`,
digits) at the prediction's own local batches, each worker on its GPU's preset curve and every
link emulated at the bandwidth that makes the stand-in's gradient take the job's predicted
all-reduce. The measured steady step (wall clock between steps after the warm-up) is converted
to device seconds by the emulated clock (`figures`' docstring), then to hours for `--steps` and
to cost at the catalog's price, as recommend prices a mix. Start-up, profiling and evaluation
are not counted on either side (recommend does not price them). Figures:
docs/measurements/recommend.md.
"""

from __future__ import annotations

import argparse
import statistics
import struct
from pathlib import Path

from hetflow.cli.args import Parser
from hetflow.config import (
    DEADLINE_MARGIN,
    ClusterSpec,
    ConfigError,
    TrainConfig,
    WorkerSpec,
    check_job,
    validated,
)
from hetflow.emulation.costs import SMOOTH_PHASES
from hetflow.emulation.presets import PRESETS
from hetflow.forecast.rent.search import (
    CURVE_MODEL,
    TRAIN_OVER_INFERENCE,
    Evaluator,
    Job,
    Objective,
    local_batches,
    search,
)
from hetflow.forecast.simulate.models import MODELS
from hetflow.records import Plan, RunResult
from hetflow.repeats import run_order
from hetflow.training.launch.run import run_plan
from hetflow.training.metrics import summarize

from benchmarks import check_bench_recipe, digits_workspace, write_json
from benchmarks.recommend.figures import (
    device_seconds_per_emulated,
    even_host_peaks,
    link_for,
    measured_row,
    naive_mixes,
    phases,
    pooled_cpu_per_sample,
    typical_settled,
    versus_naive,
)
from benchmarks.recommend.table import print_table

STAND_INS = ("digits-mlp", "digits-cnn", "digits-wide-mlp")


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="hetflow bench recommend", description=__doc__.splitlines()[0])
    p.add_argument("--candidates", default="g4dn.xlarge:2,p3.2xlarge:2", metavar="TYPE:N,...")
    p.add_argument("--job-recipe", default="resnet50", dest="job_recipe", choices=sorted(MODELS))
    p.add_argument("--global-batch", type=int, default=448, dest="global_batch")
    p.add_argument("--steps", type=int, default=10_000, help="the job's steps (hours, cost)")
    p.add_argument("--deadline-h", type=float, default=2.0, dest="deadline_h", metavar="H")
    p.add_argument(
        "--deadline-margin",
        type=float,
        default=DEADLINE_MARGIN,
        dest="deadline_margin",
        metavar="F",
        help=f"recommend's margin on the deadline (default {DEADLINE_MARGIN})",
    )
    p.add_argument("--run-steps", type=int, default=30, dest="run_steps", help="steps run")
    p.add_argument("--stand-in", default="digits-mlp", dest="stand_in", choices=STAND_INS)
    p.add_argument("--time-scale", type=float, default=32.0, dest="time_scale")
    p.add_argument(
        "--even-host",
        action="store_true",
        dest="even_host",
        help="scale each worker's emulated speed by its batch's CPU per sample on this host "
        "over the pooled one (from the pilot run), so the host's own fixed cost per step does "
        "not unbalance a mix (figures.even_host_peaks)",
    )
    p.add_argument("--max-ranks", type=int, default=4, dest="max_ranks")
    p.add_argument(
        "--cpu-quotas",
        action="store_true",
        dest="cpu_quotas",
        help="check recommend on real workers instead: each type a kernel CPU quota from its "
        "published peak, profiled alone, its mixes trained for real (benchmarks.recommend."
        "quotas); without it the check is the emulated one, a self-consistency check",
    )
    p.add_argument(
        "--quota-cores",
        type=float,
        default=0.5,
        dest="quota_cores",
        metavar="CORES",
        help="with --cpu-quotas: the quota of the fastest candidate GPU's worker; the others "
        "in proportion to their published peak samples/s",
    )
    p.add_argument(
        "--mixes",
        type=int,
        default=3,
        help="with --cpu-quotas: how many of the mixes recommend ranks are run (its choice first)",
    )
    p.add_argument("--repeat", type=int, default=1, help="run every choice N times (median)")
    p.add_argument("--json", dest="json_path")
    return p


def positive(flag: str, value):
    if not value > 0:
        raise ConfigError(f"{flag}: must be > 0 (got {value})")
    return value


def plan_choices(args):
    """(candidates, recommendation, {choice: (counts, prediction, local batches)}), checked:
    a one-line ConfigError naming the flag before anything runs."""
    from hetflow.forecast.rent.rental import candidates
    from hetflow.forecast.simulate.clusters import parse_mix
    from hetflow.infra.market import load_market

    for flag in (
        "global_batch",
        "steps",
        "deadline_h",
        "run_steps",
        "time_scale",
        "repeat",
        "max_ranks",
    ):
        positive(f"--{flag.replace('_', '-')}", getattr(args, flag))
    job = Job(MODELS[args.job_recipe], global_batch=args.global_batch, steps=args.steps)
    try:
        mix = parse_mix(args.candidates)
    except ConfigError as e:
        raise ConfigError(str(e).replace("--mix", "--candidates")) from None
    cands = candidates(mix, job, load_market())
    if not 0 <= args.deadline_margin < 1:
        raise ConfigError(f"--deadline-margin: must be in [0, 1) (got {args.deadline_margin:g})")
    goal = Objective("deadline", deadline_h=args.deadline_h, margin=args.deadline_margin)
    rec = search(cands, job, goal)
    peaks = [c.devices * PRESETS[c.preset].peak_samples_per_s for c in cands]
    mixes = {"recommended": rec.best.counts} | naive_mixes(
        [c.usd_per_hour for c in cands], peaks, [c.available for c in cands]
    )
    ev, out = Evaluator(cands, job), {}
    for name, counts in mixes.items():
        gpus = sum(c.devices * n for c, n in zip(cands, counts, strict=True))
        if gpus > args.max_ranks:
            raise ConfigError(
                f"--candidates: {name} ({counts}) needs {gpus} emulated ranks, more than "
                f"--max-ranks {args.max_ranks}: offer fewer instances"
            )
        p = ev(counts)
        if p is None:
            raise ConfigError(f"--candidates: {name} ({counts}) cannot take the global batch")
        out[name] = (counts, p, local_batches(cands, p, job.global_batch))
    return cands, rec, out


def emulated_cluster(name, cands, counts, peaks, args, k, comm_s) -> ClusterSpec:
    """One worker per GPU of the mix on its preset (speed: `peaks` / 1000, its exact peak
    samples/s unless `--even-host`), an instance per node, every link at
    `figures.link_for`'s bandwidth."""
    n = len(peaks)
    sent = 2 * (n - 1) / n * MODELS[args.stand_in].grad_bytes
    gbps = link_for(comm_s, k, args.time_scale, sent)
    workers, speeds = [], iter(peaks)
    for c, m in zip(cands, counts, strict=True):
        stem = c.instance_type.replace(".", "-")
        for i in range(m):
            for g in range(c.devices):
                workers.append(
                    WorkerSpec(
                        name=f"{stem}-{i}-{g}",
                        preset=c.preset,
                        speed=next(speeds) / 1e3,
                        node=f"{stem}-{i}",
                        link_gbps=gbps,
                    )
                )
    return ClusterSpec(name=name, workers=workers, time_scale=args.time_scale)


def table_cpu(run_dir: Path, batches: list[int], world: int) -> dict[int, float]:
    """Per local batch, the CPU time the run's emulator dilated from (`typical_settled`)."""
    folder = run_dir / "emulator" / "train-fp32"
    out = {}
    for b in set(batches) - {0}:
        raw = (folder / f"0-{b}").read_bytes()
        records = list(struct.iter_unpack("<id", raw[: len(raw) - len(raw) % 12]))
        out[b] = typical_settled(records, world, SMOOTH_PHASES)
    return out


PILOT_STEPS = 12  # the pilot run that reads the host's CPU cost of each local batch
SKIP_STEPS = 3  # a run's first steps, left out of `figures.phases`


def run_once(cluster, flat, args, steps, dataset, run_dir) -> tuple[float, dict, dict]:
    """One emulated run of `steps` steps at local batches `flat`: (its steady step, the wall
    clock between steps after the warm-up; the CPU time its emulator dilated from per local
    batch, `table_cpu`; where its steps went, `figures.phases`)."""
    knobs = {
        "recipe": args.stand_in,
        "steps": steps,
        "global_batch": args.global_batch,
        "schedule": "proportional",
        "compression": "none",
        "eval_every": steps,
        "checkpoint_every": steps,
    }
    cfg = validated(TrainConfig, knobs, "train")
    check_job(cluster, cfg)
    ran = run_plan(cluster, Plan(local_batches=flat), cfg, dataset, run_dir, variant=cluster.name)
    result = RunResult.model_validate(ran.raw)
    m = summarize(result, cfg.global_batch, cfg.target_accuracy, cfg.target_val_loss)
    records = [[r.model_dump() for r in rank.records] for rank in result.ranks]
    return (
        cfg.global_batch / m.steady_samples_per_s,
        table_cpu(run_dir, flat, len(flat)),
        phases(records, skip=min(SKIP_STEPS, steps // 2)),
    )


def run_choice(name, round_, cands, choice, args, dataset, tmp) -> dict:
    """A choice's pilot run (no link emulated) gives the host's CPU per sample, hence the
    clock k and the link's bandwidth; the measured run is converted by the k of its own
    emulator's CPU times (`k`); `host_drift` is how far they moved from the pilot's, which the
    link was set from (a drift of x puts the emulated all-reduce off by about -x)."""
    counts, pred, batches = choice
    flat = [b for bs in batches for b in bs]
    peaks = [
        PRESETS[c.preset].peak_samples_per_s
        for c, bs in zip(cands, batches, strict=True)
        for _ in bs
    ]
    model = MODELS[args.job_recipe]
    scale = TRAIN_OVER_INFERENCE * model.per_sample_flops / MODELS[CURVE_MODEL].per_sample_flops

    def clock(cpu: dict[int, float]) -> float:
        c = pooled_cpu_per_sample(cpu, flat)
        return device_seconds_per_emulated(scale, args.time_scale, max(peaks), c)

    base = Path(tmp) / f"{name}-{round_}"
    bare = emulated_cluster(name, cands, counts, peaks, args, 1.0, 0.0)
    _, pilot, _ = run_once(bare, flat, args, PILOT_STEPS, dataset, base / "pilot")
    if args.even_host:
        peaks = even_host_peaks(peaks, flat, pilot)
    k_pilot = clock(pilot)
    linked = emulated_cluster(name, cands, counts, peaks, args, k_pilot, pred.comm_s)
    step, cpu, went = run_once(linked, flat, args, args.run_steps, dataset, base / "run")
    return {
        "emulated_step_s": step,
        "k": clock(cpu),
        "k_pilot": k_pilot,
        "link_gbps": linked.workers[0].link_gbps,
        "host_drift": pooled_cpu_per_sample(cpu, flat) / pooled_cpu_per_sample(pilot, flat) - 1,
        "cpu_s": cpu,
        **{f"emulated_{key}": v for key, v in went.items()},
    }


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.cpu_quotas:
        from benchmarks.recommend.quotas import run_quotas

        return run_quotas(args)
    cands, _, choices = plan_choices(args)
    check_bench_recipe(TrainConfig(recipe=args.stand_in, global_batch=args.global_batch))
    runs: dict[str, list[dict]] = {name: [] for name in choices}
    with digits_workspace("digits") as (tmp, dataset):
        for round_ in range(args.repeat):
            for name in run_order(list(choices), round_):  # each choice first in turn
                choice = choices[name]
                runs[name].append(run_choice(name, round_, cands, choice, args, dataset, tmp))
                r = runs[name][-1]
                print(
                    f"{name} round {round_}: emulated step {r['emulated_step_s'] * 1e3:.1f} ms, "
                    f"k {r['k']:.2f}, host drift {r['host_drift']:+.1%}",
                    flush=True,
                )
    rows = {}
    for name, (_, pred, batches) in choices.items():
        # each run has its own clock k (the host's pace in it): rank them in device time
        ranked = sorted(runs[name], key=lambda r: r["emulated_step_s"] * r["k"])
        med = ranked[(len(ranked) - 1) // 2]
        predicted = {"step_s": pred.step_s, "hours": pred.hours, "cost_usd": pred.cost_usd}
        rows[name] = {
            "mix": pred.label(cands),
            "local_batches": batches,
            **{f"predicted_{k}": v for k, v in predicted.items()},
            "predicted_compute_s": pred.compute_s,
            "predicted_comm_s": pred.comm_s,
            **measured_row(
                predicted, med["emulated_step_s"], med["k"], args.steps, pred.usd_per_hour
            ),
            **med,
            "measured_compute_s": med["emulated_compute_s"] * med["k"],
            "measured_data_s": med["emulated_data_s"] * med["k"],
            "measured_step_runs_s": [r["emulated_step_s"] * r["k"] for r in runs[name]],
        }
    out = {
        "flags": vars(args),
        "choices": rows,
        # the order each round ran the choices in (`repeats.run_order`)
        "orders": [run_order(list(choices), r) for r in range(args.repeat)],
        "versus_naive": versus_naive(rows, args.deadline_h),
        "max_abs_error": max(
            abs(r[e]) for r in rows.values() for e in ("hours_error", "cost_error")
        ),
        "median_host_drift": statistics.median(r["host_drift"] for r in rows.values()),
    }
    print_table(out)
    write_json(args.json_path, out)
    return 0
