"""`hetflow simulate --calibrate`: small real runs made here, each predicted from its own profile.

With torchrun (`hetflow.training.launch.run.run_workers`): a profile, then the equal split and
hetflow's plan on emulated speeds 1,1,2,4 (cnn), and one run on 4 workers behind emulated
1 Gbit/s links (digits-wide-mlp); each run is predicted from its own profile. The per-step overhead
(optimizer, DDP, Python: what a profile does not measure) is the one fitted figure, estimated
leave-one-out: each hetero run is predicted with the overhead measured on the other, the comm
run with their mean. Errors are relative errors of throughput (samples/s),
|predicted / measured - 1|.

`predict_run`, `measured_run` and `calibration_errors` are pure; `calibrate` runs the jobs
(minutes).
"""

from __future__ import annotations

import time

from hetflow.config import ClusterSpec, ConfigError, TrainConfig, check_job, link_cluster
from hetflow.forecast.simulate.clusters import profile_alpha_s, profile_workers
from hetflow.forecast.simulate.job import MODELS, Job, Network
from hetflow.forecast.simulate.step import StepPrediction, simulate_step
from hetflow.records import Profile, RunResult

HETERO_RUNS = ("baseline", "optimized")
PROFILE_KEYS = (
    "rank",
    "fit_latency_s",
    "fit_s_per_sample",
    "samples_per_s",
    "allreduce_latency_s",
    "allreduce_gbps",
    "grad_allreduce_s",
    "grad_bytes",
)
FITTED = (
    "step_overhead_s only: measured step minus predicted step; each hetero run is "
    "predicted with the other's, the comm run with their mean. a_i, c_i, alpha and link "
    "bandwidth are the profiles' own measurements."
)


# -- pure -------------------------------------------------------------------------------------


def measured_run(result: dict, global_batch: int) -> dict:
    """What a training run's result.json (`RunResult`'s shape) measured: throughput (as
    `hetflow.training.metrics.summarize` reads it), the step it implies, each rank's mean
    compute and rank 0's mean communication over the steps after the first."""
    from hetflow.training.metrics import summarize

    run = RunResult.model_validate(result)
    throughput = summarize(run, global_batch, None).throughput_samples_per_s
    ranks = sorted(run.ranks, key=lambda r: r.rank)
    steady = [r.records[1:] or r.records for r in ranks]
    return {
        "throughput_samples_per_s": throughput,
        "step_time_s": global_batch / throughput,
        "compute_s": [sum(x.compute_s for x in s) / len(s) for s in steady],
        "comm_s": sum(x.comm_s for x in steady[0]) / len(steady[0]),
    }


def predict_run(
    profile: Profile,
    model: str,
    global_batch: int,
    batches: list[int] | None,
    plan: str,
    overhead_s: float = 0.0,
) -> StepPrediction:
    """A local run as the simulator predicts it from the run's own profile (pure)."""
    workers = profile_workers(profile)
    job = Job(MODELS[model], global_batch=global_batch, step_overhead_s=overhead_s)
    net = Network(alpha_s=profile_alpha_s(profile))
    return simulate_step(workers, job, net, plan, batches=batches)


def _predict(run: dict, overhead_s: float = 0.0) -> StepPrediction:
    return predict_run(
        run["profile"], run["model"], run["global_batch"], run["batches"], run["plan"], overhead_s
    )


def _overheads_used(overhead: dict[str, float]) -> tuple[dict[str, float], float]:
    """Leave-one-out: each hetero run gets the other's overhead, every other run their mean."""
    hetero = [k for k in HETERO_RUNS if k in overhead]
    used: dict[str, float] = {}
    for k in hetero:
        others = [overhead[o] for o in hetero if o != k]
        used[k] = others[0] if others else 0.0
    pooled = sum(overhead[k] for k in hetero) / len(hetero) if hetero else 0.0
    for k in overhead:
        used.setdefault(k, pooled)
    return used, pooled


def _run_row(
    run: dict, pred: StepPrediction, zero: StepPrediction, used_s: float, own_s: float
) -> dict:
    meas = run["measured"]["throughput_samples_per_s"]
    return {
        "measured_samples_per_s": meas,
        "predicted_samples_per_s": pred.throughput_samples_per_s,
        "error": pred.throughput_samples_per_s / meas - 1,
        "predicted_profile_only_samples_per_s": zero.throughput_samples_per_s,
        "error_profile_only": zero.throughput_samples_per_s / meas - 1,
        "overhead_used_s": used_s,
        "overhead_own_s": own_s,
        "measured_step_s": run["measured"]["step_time_s"],
        "predicted_step_s": pred.step_time_s,
        "predicted_compute_s": pred.compute_s,
        "predicted_comm_s": pred.comm_s,
        "measured_compute_s": run["measured"]["compute_s"],
        "measured_comm_s": run["measured"]["comm_s"],
        "plan": pred.local_batches,
    }


def calibration_errors(runs: dict[str, dict]) -> dict:
    """From measured runs and their profiles: leave-one-out overhead, predictions, errors (pure).

    runs[name] = {"profile": Profile, "model", "global_batch", "batches", "plan", "measured"
    (as `measured_run` gives it)}; names `baseline` and `optimized` (hetero) and `comm`.
    """
    zero = {k: _predict(r) for k, r in runs.items()}
    overhead = {k: max(0.0, runs[k]["measured"]["step_time_s"] - zero[k].step_time_s) for k in runs}
    used, pooled = _overheads_used(overhead)
    rows = {
        k: _run_row(r, _predict(r, used[k]), zero[k], used[k], overhead[k]) for k, r in runs.items()
    }
    hetero = [k for k in HETERO_RUNS if k in runs]
    comm = rows.get("comm")
    return {
        "runs": rows,
        "hetero_error": max((abs(rows[k]["error"]) for k in hetero), default=None),
        "comm_error": abs(comm["error"]) if comm else None,
        "hetero_error_profile_only": max(
            (abs(rows[k]["error_profile_only"]) for k in hetero), default=None
        ),
        "comm_error_profile_only": abs(comm["error_profile_only"]) if comm else None,
        "step_overhead_s": pooled,
        "fitted": FITTED,
    }


# -- the runs (torchrun) ----------------------------------------------------------------------


def _jobs(steps: int) -> dict[str, tuple[ClusterSpec, TrainConfig]]:
    """The two jobs calibrated: heterogeneous speeds (digits-cnn), and a slow link
    (digits-wide-mlp)."""
    if steps < 5:
        raise ConfigError(f"--calibrate-steps: at least 5 (got {steps})")
    quiet = {
        "steps": steps,
        "eval_every": steps,
        "rebalance_every": steps,
        "checkpoint_every": steps,
        "target_accuracy": None,
        "global_batch": 128,
    }
    jobs = {
        "hetero": (
            ClusterSpec.from_speeds([1, 1, 2, 4], name="calibrate-1-1-2-4"),
            TrainConfig(recipe="digits-cnn", **quiet),
        ),
        "comm": (
            link_cluster(1.0, 0.0),
            TrainConfig(recipe="digits-wide-mlp", schedule="equal", compression="none", **quiet),
        ),
    }
    for cluster, cfg in jobs.values():
        check_job(cluster, cfg)
    return jobs


def _profile(label: str, cluster: ClusterSpec, cfg: TrainConfig, dataset, tmp: str) -> Profile:
    """The cluster profiled by its own workers (a profile-mode run)."""
    from hetflow.training.launch.run import measure_profile

    profile = measure_profile(cluster, dataset, cfg, f"{tmp}/{label}-profile")
    print(f"{label}: profiled in {profile.profiling_time_s:.0f}s", flush=True)
    return profile


def _train(
    name: str,
    cluster: ClusterSpec,
    cfg: TrainConfig,
    plan,
    dataset,
    tmp: str,
    profile: Profile,
    sim_plan: str,
) -> dict:
    """One training run with this plan (the workers it drops not launched: `run_plan`), as
    `calibration_errors` takes it."""
    from hetflow.training.launch.run import run_plan

    ran = run_plan(cluster, plan, cfg, dataset, f"{tmp}/{name}", variant=name)
    result, wall = ran.raw, ran.wall_s
    run = {
        "profile": profile,
        "model": cfg.recipe,
        "global_batch": cfg.global_batch,
        "batches": plan.local_batches,
        "plan": sim_plan,
        "measured": measured_run(result, cfg.global_batch),
    }
    print(
        f"{name}: plan {plan.local_batches}, "
        f"{run['measured']['throughput_samples_per_s']:.0f} samples/s ({wall:.0f}s)",
        flush=True,
    )
    return run


def _hetero_runs(cluster, cfg, dataset, tmp: str) -> tuple[Profile, dict[str, dict]]:
    """The hetero job profiled, then run with the equal split and with hetflow's plan."""
    from hetflow.training.plan.planner import make_plan

    profile = _profile("hetero", cluster, cfg, dataset, tmp)
    runs = {}
    for name, schedule in (("baseline", "equal"), ("optimized", "proportional")):
        run_cfg = cfg.model_copy(update={"schedule": schedule, "compression": "none"})
        plan = make_plan(profile, cluster, run_cfg)
        runs[name] = _train(name, cluster, run_cfg, plan, dataset, tmp, profile, name)
    return profile, runs


def _profile_rows(profile: Profile) -> list[dict]:
    """The figures of each rank that the predictions used, in rank order."""
    ranks = sorted(profile.ranks, key=lambda r: r.rank)
    return [{k: getattr(r, k) for k in PROFILE_KEYS} for r in ranks]


def calibrate(steps: int) -> dict:
    """Small real runs here (torchrun, emulated workers), each predicted from its own profile."""
    from hetflow.infra.workspace import digits_workspace
    from hetflow.records import Plan

    jobs = _jobs(steps)
    t0 = time.perf_counter()
    with digits_workspace("calibrate-digits") as (tmp, dataset):
        hetero_profile, runs = _hetero_runs(*jobs["hetero"], dataset, tmp)
        cluster, cfg = jobs["comm"]
        comm_profile = _profile("comm", cluster, cfg, dataset, tmp)
        equal = Plan.equal([cfg.global_batch // 4] * 4)
        runs["comm"] = _train("comm", cluster, cfg, equal, dataset, tmp, comm_profile, "baseline")
    out = calibration_errors(runs)
    out["profiles"] = {
        name: _profile_rows(p) for name, p in (("hetero", hetero_profile), ("comm", comm_profile))
    }
    out["setup"] = {
        "hetero": "speeds 1,1,2,4, digits-cnn, global batch 128, equal split vs hetflow's "
        "static plan",
        "comm": "4 x speed 1, digits-wide-mlp, link 1 Gbit/s per worker, equal split, "
        "no compression",
        "steps": steps,
        "throughput_from_step": 1,
    }
    out["wall_s"] = time.perf_counter() - t0
    return out
