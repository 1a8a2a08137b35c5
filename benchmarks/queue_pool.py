"""`hetflow bench queue --pool`: what the queue session's warm pool saves a job's launch, on
real processes, against the same launches with none.

Two elastic jobs in turn (`faults.on_loss: continue`, `digits-mlp`, 4 emulated workers of
speeds 1, 1, 2, 4, a few steps each), as a session runs one job after another on the same
workers: `pool`, inside a session's pool of one warm worker per worker
(`training.elastic.pool.session_pool`, opened just before the first job, as the queue opens
it at its first elastic job's start), the second job started once the pool has refilled;
`pool-now`, the same pool, the second job started as soon as the first ended (it takes the
workers that are ready, else one still importing, else starts cold); `cold`, with none (each
rank a new Python process that imports torch). Measured on each job: its start-up, the
submit to the last rank's first step (`startup_s`, the ranks' `Timeline.first_step_s`), and
each phase's median over its ranks
(`training.launch.startup`), and `wall_s`, both jobs from the pool's opening: the pool's
imports (one worker at a time) are paid beside the first job and, under `pool`, while the
second waits for the refill, never in the second's start-up, so `wall_s` is what each
variant costs whole. Each round rotates which variant runs first; reported: each round, the
medians, and each pool variant over `cold`.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from statistics import median

from hetflow.repeats import median_spread

PHASES = ("spawn_s", "import_s", "rendezvous_s", "data_s", "model_s", "first_step_s")


def _job(folder: Path, dataset, steps: int, time_scale: float):
    from hetflow.config import ClusterSpec, TrainConfig
    from hetflow.records import Plan
    from hetflow.training.launch.spec import RunSpec

    train = TrainConfig(
        recipe="digits-mlp",
        global_batch=64,
        steps=steps,
        checkpoint_every=steps,
        eval_every=steps,
        faults={"on_loss": "continue"},
    )
    run_dir = folder / f"run-{time.monotonic_ns()}"
    return RunSpec(
        run_name=run_dir.name,
        variant="pool",
        cluster=ClusterSpec.from_speeds([1, 1, 2, 4], time_scale=time_scale),
        dataset=dataset,
        train=train,
        plan=Plan.equal([16, 16, 16, 16]),
        run_dir=str(run_dir),
    )


def _startup(raw: dict) -> dict:
    """A job's start-up: the last rank's first step since the submit, each phase's median."""
    from hetflow.records import RunResult

    ranks = RunResult.model_validate(raw).ranks
    out = {"startup_s": round(max(r.timeline.first_step_s for r in ranks), 3)}
    for name in PHASES:
        out[name] = round(median(getattr(r.timeline.startup, name) for r in ranks), 3)
    return out


VARIANTS = ("pool", "pool-now", "cold")


def two_jobs(folder: Path, dataset, variant: str, steps: int, time_scale: float) -> dict:
    """The two jobs in turn under `variant` (see the module): each one's start-up, and the
    wall time of both from the pool's opening (`wall_s`)."""
    import contextlib

    from hetflow.training.elastic.pool import session_pool
    from hetflow.training.launch.run import run_workers

    out, t = {}, time.perf_counter()
    with session_pool(4) if variant != "cold" else contextlib.nullcontext() as pool:
        for name in ("first", "second"):
            raw, _ = run_workers(_job(folder, dataset, steps, time_scale))
            out[name] = _startup(raw)
            if variant == "pool":  # refilled, its imports waited for, before the next job
                out[f"{name}_refilled"] = pool.wait_ready(300)
    out["wall_s"] = round(time.perf_counter() - t, 3)
    return out


def measure_pool(repeats: int, steps: int = 6, time_scale: float = 20.0) -> dict:
    """`repeats` rounds of the variants, the first of a round rotated (see the module)."""
    from hetflow.config import DatasetSpec
    from hetflow.infra.data.format import digits_source, write_dataset

    runs = []
    with tempfile.TemporaryDirectory(prefix="hetflow-pool-") as tmp:
        data = Path(tmp) / "digits"
        (data / "train").mkdir(parents=True)
        (data / "test").mkdir()
        dataset = DatasetSpec(url=data.as_uri(), cache_dir=str(Path(tmp) / "cache"))
        write_dataset(dataset.url, digits_source(dataset.test_fraction, dataset.seed), 256)
        for r in range(repeats):
            order = VARIANTS[r % 3 :] + VARIANTS[: r % 3]
            run = {v: two_jobs(Path(tmp), dataset, v, steps, time_scale) for v in order}
            runs.append(run)
            print(run, flush=True)
    summary = {}
    for variant in VARIANTS:
        for job in ("first", "second"):
            for name in ("startup_s", *PHASES):
                values = [x[variant][job][name] for x in runs]
                summary[f"{variant}/{job}/{name}"] = median_spread(values)[0]
        summary[f"{variant}/wall_s"] = median_spread([x[variant]["wall_s"] for x in runs])[0]
    for variant in VARIANTS[:2]:
        for figure, get in (
            ("second", lambda v: v["second"]["startup_s"]),
            ("wall", lambda v: v["wall_s"]),
        ):
            ratios = [get(x[variant]) / get(x["cold"]) for x in runs]
            key = f"{figure}_{variant}_over_cold"
            summary[key], summary[f"{key}_range"] = median_spread(ratios)
    return {"runs": runs, "median": summary}
