"""`hetflow bench queue --pool`: what the queue session's warm pool saves a job's launch, on
real processes, against the same launches with none.

Two elastic jobs in turn (`faults.on_loss: continue`, `digits-mlp`, 4 emulated workers of
speeds 1, 1, 2, 4, a few steps each), as a session runs one job after another on the same
workers: `pool`, inside a session's pool of one warm worker per worker
(`training.elastic.pool.session_pool`, opened just before the first job, as the queue opens
it at its first elastic job's start); `cold`, with none (each rank a new Python process that
imports torch). Measured on each job: its start-up, the submit to the last rank's first step
(`startup_s`, the ranks' `Timeline.first_step_s`), and each phase's median over its ranks
(`training.launch.startup`). The second job is the figure: it starts once the pool has
refilled (its workers are started one at a time, each once the one before has imported, as
between a session's jobs); the first's were started a moment before it, one still importing
as it launches, the others cold. The variants alternate which runs
first; reported: each repeat, the medians, and pool over cold.
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


def two_jobs(folder: Path, dataset, pooled: bool, steps: int, time_scale: float) -> dict:
    """The two jobs in turn, inside a session's pool where `pooled`: each one's start-up."""
    import contextlib

    from hetflow.training.elastic.pool import session_pool
    from hetflow.training.launch.run import run_workers

    out = {}
    with session_pool(4) if pooled else contextlib.nullcontext() as pool:
        for name in ("first", "second"):
            raw, _ = run_workers(_job(folder, dataset, steps, time_scale))
            out[name] = _startup(raw)
            if pool is not None:  # refilled, as between a session's jobs, before the next
                out[f"{name}_refilled"] = pool.wait_ready(300)
    return out


def measure_pool(repeats: int, steps: int = 6, time_scale: float = 20.0) -> dict:
    """`repeats` rounds of both variants, alternating which runs first (see the module)."""
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
            order = (True, False) if r % 2 == 0 else (False, True)
            run = {}
            for pooled in order:
                run["pool" if pooled else "cold"] = two_jobs(
                    Path(tmp), dataset, pooled, steps, time_scale
                )
            runs.append(run)
            print(run, flush=True)
    summary = {}
    for variant in ("pool", "cold"):
        for job in ("first", "second"):
            for name in ("startup_s", *PHASES):
                values = [x[variant][job][name] for x in runs]
                summary[f"{variant}/{job}/{name}"] = median_spread(values)[0]
    ratios = [x["pool"]["second"]["startup_s"] / x["cold"]["second"]["startup_s"] for x in runs]
    summary["second_pool_over_cold"], summary["second_pool_over_cold_range"] = median_spread(ratios)
    return {"runs": runs, "median": summary}
