"""`hetflow bench recommend --cpu-quotas`: recommend checked on real unequal workers it did not
shape.

    hetflow bench recommend --cpu-quotas --json recquota.json
    hetflow bench recommend --cpu-quotas --candidates g4dn.xlarge:2,p3.2xlarge:1 --repeat 2

Every instance type of `--candidates` is given a CPU quota per GPU worker by a rule fixed
before anything runs (`quota_figures.quota_rule`: `--quota-cores` x its GPU's published peak
over the fastest's). Then, as a user would:

1. each type is profiled alone, one worker on its quota (`measure_profile`, the profile
   `hetflow profile` runs), for the stand-in recipe (`--stand-in`, a digits model);
2. recommend (`hetflow.forecast.rent.recommend.recommend`, the command's pipeline) is given those
   profiles as the history's measured curves, the job (`--global-batch`, `--steps`) and the
   least cost as objective, nothing else;
3. its choice and the mixes it ranks next (`quota_figures.mixes_to_run`) are trained for
   real, `--run-steps` steps, one rank per GPU in its own cgroup at its type's quota, at the
   prediction's local batches (no emulation: each worker's speed is the kernel's doing).

Per mix it reports the predicted and measured steady step, training time of the steps run,
wall clock with launch (not priced by recommend), the job's hours and cost, each with its
error, and per worker its predicted and measured compute. The host's load average before
each run is kept beside it: a quota is a ceiling, and other processes on the host can keep a
worker under it. Figures: docs/measurements/recommend.md.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from hetflow.config import (
    ClusterSpec,
    ConfigError,
    RecommendJob,
    RecommendRequest,
    RentableType,
    TrainConfig,
    WorkerSpec,
    check_job,
    validated,
)
from hetflow.emulation.presets import PRESETS
from hetflow.forecast.rent.measured import curve_of
from hetflow.forecast.rent.recommend import recommend
from hetflow.forecast.rent.rental import History
from hetflow.forecast.rent.search import PRESET_OF_GPU, Evaluator, local_batches
from hetflow.forecast.simulate.clusters import parse_mix
from hetflow.records import Plan
from hetflow.repeats import run_order
from hetflow.training.cores import host_cores
from hetflow.training.cpu_quota import check_quotas, find_controller
from hetflow.training.launch.run import measure_profile, run_plan

from benchmarks import check_bench_recipe, digits_workspace, write_json
from benchmarks.recommend.quota_figures import (
    cpu_stat,
    mix_row,
    mixes_to_run,
    profile_batches,
    quota_rule,
    throttled_share,
    within,
    worker_rows,
)

SKIP_STEPS = 3  # a run's first steps: warm-up, left out of the steady step
GOAL = 0.15  # the error the check is judged against
HISTORY = "profiled alone on its quota here"


class ThrottleWatch:
    """Reads each rank cgroup's `cpu.stat` of job `run_name` every `every_s` while the job runs
    (its launcher removes the cgroups after it): per rank, the (time, nr_periods,
    nr_throttled) samples, for `quota_figures.throttled_share`. Written here: the cgroup
    files are the kernel's interface, and no library reads a cgroup that is about to go."""

    def __init__(self, run_name: str, ranks: int, every_s: float = 0.2):
        controller = find_controller()
        self.paths = (
            [controller.rank_dir(run_name, r) / "cpu.stat" for r in range(ranks)]
            if controller
            else []
        )
        self.samples: list[list[tuple[float, int, int]]] = [[] for _ in range(ranks)]
        self.every_s, self.stop = every_s, threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self.stop.wait(self.every_s):
            for path, kept in zip(self.paths, self.samples, strict=True):
                try:
                    stat = cpu_stat(path.read_text())
                except (OSError, ValueError):
                    continue
                kept.append((time.monotonic(), stat["nr_periods"], stat["nr_throttled"]))

    def __enter__(self) -> ThrottleWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()

    def shares(self) -> list[float | None]:
        return [throttled_share(kept) for kept in self.samples]


def type_quotas(args, market) -> tuple[list[tuple[str, int]], dict[str, float]]:
    """(the candidates, each type's quota by the rule), checked: a one-line ConfigError naming
    the flag for a type the catalog lacks or whose GPU has no published peak."""
    try:
        mix = parse_mix(args.candidates)
    except ConfigError as e:
        raise ConfigError(str(e).replace("--mix", "--candidates")) from None
    peaks = {}
    for name, _ in mix:
        info = market.types.get(name)
        preset = PRESET_OF_GPU.get((info.gpu_name or "") if info else "")
        if preset is None:
            raise ConfigError(
                f"--candidates: {name} has no GPU with a published peak (T4, V100, A100), "
                "so the quota rule cannot give it a quota"
            )
        peaks[name] = PRESETS[preset].peak_samples_per_s
    if not args.quota_cores >= 0.1:
        raise ConfigError(f"--quota-cores: at least 0.1 (got {args.quota_cores:g})")
    return mix, quota_rule(peaks, args.quota_cores)


def train_config(args, steps: int) -> TrainConfig:
    knobs = {
        "recipe": args.stand_in,
        "steps": steps,
        "global_batch": args.global_batch,
        "schedule": "proportional",
        "compression": "none",
        "eval_every": steps,
        "checkpoint_every": steps,
    }
    return validated(TrainConfig, knobs, "train")


def profile_alone(name: str, quota: float, args, dataset, run_dir: Path):
    """One worker of type `name` on its quota, profiled alone: its measured curve and what the
    profile read (its fit and memory cap) and how often its quota was used up."""
    worker = WorkerSpec(name=name.replace(".", "-"), cpu_quota=quota)
    cluster = ClusterSpec(name=f"alone-{worker.name}", workers=[worker], emulate=False)
    check_quotas(cluster, len(host_cores()))
    load = os.getloadavg()[0]
    batches = profile_batches(args.global_batch)
    with ThrottleWatch(run_dir.name, 1) as watch:
        profile = measure_profile(cluster, dataset, train_config(args, 1), run_dir, batches)
    rank = profile.ranks[0]
    curve = curve_of(rank, f"{HISTORY} ({quota:g} cores)")
    if curve is None:
        raise ConfigError(f"--stand-in: the profile of {name} fits no step-time curve")
    return curve, {
        "cpu_quota": quota,
        "profile_batches": batches,
        "fit_latency_s": rank.fit_latency_s,
        "fit_s_per_sample": rank.fit_s_per_sample,
        "memory_cap_batch": rank.memory_cap_batch,
        "profiling_time_s": profile.profiling_time_s,
        "throttled_share": watch.shares()[0],
        "load_before": load,
    }


def request_of(args, mix) -> RecommendRequest:
    return RecommendRequest(
        job=RecommendJob(recipe=args.stand_in, global_batch=args.global_batch, steps=args.steps),
        candidates=[RentableType(instance_type=t, count=n) for t, n in mix],
    )


def cluster_of(rec, counts, quotas, batches) -> tuple[ClusterSpec, list[str], list[float]]:
    """One worker per GPU of the mix, each at its type's quota, no emulation."""
    workers = []
    for c, n, bs in zip(rec.ranking.cands, counts, batches, strict=True):
        stem = c.instance_type.replace(".", "-")
        names = [f"{stem}-{i}-{g}" for i in range(n) for g in range(c.devices)]
        for name, _ in zip(names, bs, strict=True):
            workers.append(WorkerSpec(name=name, cpu_quota=quotas[c.instance_type]))
    label = "+".join(
        f"{c.instance_type}x{n}" for c, n in zip(rec.ranking.cands, counts, strict=True) if n
    )
    cluster = ClusterSpec(name=label.replace(".", "-"), workers=workers, emulate=False)
    return cluster, [w.name for w in workers], [w.cpu_quota for w in workers]


def run_mix(rec, counts, quotas, args, dataset, run_dir: Path) -> dict:
    """One real run of the mix `counts` at the prediction's local batches: its rows."""
    cands, job = rec.ranking.cands, rec.ranking.job
    pred = Evaluator(cands, job)(counts)
    batches = local_batches(cands, pred, job.global_batch)
    flat = [b for bs in batches for b in bs]
    cluster, names, qs = cluster_of(rec, counts, quotas, batches)
    cfg = train_config(args, args.run_steps)
    check_job(cluster, cfg)
    check_quotas(cluster, len(host_cores()))
    load = os.getloadavg()[0]
    with ThrottleWatch(run_dir.name, len(flat)) as watch:
        plan = Plan(local_batches=flat)
        ran = run_plan(cluster, plan, cfg, dataset, run_dir, variant=cluster.name)
    ranks = sorted(ran.result.ranks, key=lambda r: r.rank)
    skip = min(SKIP_STEPS, args.run_steps // 2)
    curves = [c.step_s[b - 1] for c, bs in zip(cands, batches, strict=True) for b in bs]
    predicted = {"step_s": pred.step_s, "hours": pred.hours, "cost_usd": pred.cost_usd}
    return {
        "mix": pred.label(cands),
        "counts": list(counts),
        "local_batches": flat,
        "predicted_step_s": pred.step_s,
        "predicted_compute_s": pred.compute_s,
        "predicted_comm_s": pred.comm_s,
        "predicted_hours": pred.hours,
        "predicted_cost_usd": pred.cost_usd,
        "usd_per_hour": pred.usd_per_hour,
        **mix_row(
            predicted,
            [r.step_s for r in ranks[0].records],
            skip,
            args.run_steps,
            args.steps,
            pred.usd_per_hour,
            ran.wall_s,
        ),
        "workers": [
            row | {"instance_type": t, "throttled_share": share}
            for row, t, share in zip(
                worker_rows(
                    names,
                    qs,
                    [r.cpu_quota for r in ranks],
                    flat,
                    curves,
                    [[s.compute_s for s in r.records] for r in ranks],
                    skip,
                ),
                [c.instance_type for c, bs in zip(cands, batches, strict=True) for _ in bs],
                watch.shares(),
                strict=True,
            )
        ],
        "load_before": load,
    }


def run_quotas(args) -> int:
    """Profile each type alone, ask recommend, run its mixes; print and write the report."""
    from hetflow.infra.market import load_market

    from benchmarks.recommend.table import print_quota_table

    for flag in ("global_batch", "steps", "run_steps", "repeat", "max_ranks", "mixes"):
        if not getattr(args, flag) > 0:
            raise ConfigError(f"--{flag.replace('_', '-')}: must be > 0")
    market = load_market()
    mix, quotas = type_quotas(args, market)
    check_bench_recipe(train_config(args, args.run_steps))
    out: dict = {"flags": vars(args), "quota_rule": quotas, "goal": GOAL}
    with digits_workspace("digits") as (tmp, dataset):
        curves, out["profiles"] = {}, {}
        for name, _ in mix:
            curves[name], out["profiles"][name] = profile_alone(
                name, quotas[name], args, dataset, Path(tmp) / f"profile-{name}"
            )
        rec = recommend(request_of(args, mix), History(HISTORY, 24.0, curves, {}), market)
        ranking = rec.ranking
        gpus = [c.devices for c in ranking.cands]
        singles = [p.counts for p in ranking.singles.values()]
        ranked = [p.counts for p in ranking.ranked]
        chosen = mixes_to_run(ranked, singles, gpus, args.max_ranks, args.mixes)
        names = [str(c) for c in chosen]
        runs: dict[str, list[dict]] = {n: [] for n in names}
        for round_ in range(args.repeat):
            for name in run_order(names, round_):  # each mix first in turn
                counts = chosen[names.index(name)]
                where = Path(tmp) / f"run-{round_}-{names.index(name)}"
                row = run_mix(rec, counts, quotas, args, dataset, where)
                runs[name].append(row | {"round": round_})
                print(f"{row['mix']} round {round_}: step error {row['step_error']:+.1%}")
    out["recommended"] = rec.best.label(ranking.cands)
    out["runs"] = [r for n in names for r in runs[n]]
    out["orders"] = [run_order(names, r) for r in range(args.repeat)]
    out["within_goal"] = within(out["runs"], ("step_error", "train_error"), GOAL)
    print_quota_table(out)
    write_json(args.json_path, out)
    return 0
