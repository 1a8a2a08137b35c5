"""`hetflow bench queue --real`: the queue flow itself, first come first served blind to the
device type (`--policy fifo`) against the allocator, on the same arrivals.

The workers are real processes of unequal speed: emulated device presets (`--real-speeds`),
each step's compute its host CPU time dilated by its preset's published curve at
`--time-scale`. The jobs (`real_jobs`) are `digits-cnn` jobs of three classes, the higher
ones arriving later: `--real-case three`, three jobs on the three workers; `queued`, five, so
that FIFO must queue some. Under FIFO each asks for one worker and takes the first free one
in the cluster's order. Since that order decides what FIFO's blind pick lands on, repeat r
lists the workers rotated left by r, so over three repeats each kind comes first once; both
policies of a repeat see the same order. The jobs run elastic (`QueueJob.in_place`: the
allocator's moves that keep some of a job's workers happen in place), under both policies alike;
`--real-relaunch`: not, every move a stop at a checkpoint and a relaunch.

Each policy pays its own costs: every session runs on a dataset bucket of its own, whose
profile history is empty, so the allocator places its jobs from a prior (the presets'
published ratios) and learns the unit from the first job's steps (`tasks.queue_pace`), its
time to model each job on its clock (`measuring_s`: the session does nothing else meanwhile;
the jobs' completion counts from their arrival); FIFO models none. `--real-measure-first`
adds a variant, `MEASURED`: the allocator profiling the cluster as the first job arrives, as
it did before it learned from steps; `--real-equal-prior` another, `EQUAL`: the allocator
placing from the equal split, as on workers with no published figures (the emulated presets
are built from the same published curves the default prior reads, so that prior ranks them
exactly). Each repeat runs both policies, which one first
alternating (`hetflow.repeats.run_order`). Reported per policy, as the median over repeats
with its min-max: average completion, makespan, the high job's wait, each job's wait and
completion; per repeat the ratio of the allocator's average completion to FIFO's, with its
median and min-max; each move in place's times from its request (to the worker free, to the
giving job stepping again, to the taking job stepping), the taking job's split by whether it
grew in place while running or launched on the worker. How much training outweighs
launching: each session's training loops' seconds over its launches' (a launch: the
processes, the plan, the checkpoint, recording).
"""

from __future__ import annotations

from hetflow.repeats import median_spread, run_order

POLICIES = ("fifo", "allocator")
# `--real-measure-first`'s variant: the allocator profiling each job's kinds first; and
# `--real-equal-prior`'s: the allocator placing from the equal split, not the presets' ratios
MEASURED = "allocator-measured"
EQUAL = "allocator-equal"
VARIANTS = {MEASURED: {"measure": True}, EQUAL: {"published": False}}
FIGURES = ("avg_job_completion_s", "makespan_s", "high_wait_s", "train_over_launch")


CASES = ("three", "queued")


def real_jobs(steps: int, every: int | None = None, case: str = "three", in_place=True) -> list:
    """Digits jobs, each asking FIFO for one worker, run elastic where `in_place`; a
    checkpoint every `every` steps (a fifth of `steps` where None). `three`: one per class,
    the higher ones arriving later, `low` and `normal` of `steps` steps, `high` of half;
    `queued`: those and two more of half, `low-2` and `normal-2`, arriving after them."""
    from hetflow.config.queue import QueueJob

    every = every or max(1, steps // 5)
    common = {
        "recipe": "digits-cnn",
        "global_batch": 64,
        "checkpoint_every": every,
        "in_place": in_place,
    }
    half = {"steps": steps // 2, "workers": 1, **common}
    more = [
        QueueJob(name="low-2", priority="low", arrive_after_s=15, **half),
        QueueJob(name="normal-2", priority="normal", arrive_after_s=20, **half),
    ]
    return (more if case == "queued" else []) + [
        QueueJob(name="low", priority="low", steps=steps, workers=1, **common),
        QueueJob(
            name="normal", priority="normal", steps=steps, workers=1, arrive_after_s=5, **common
        ),
        QueueJob(
            name="high", priority="high", steps=steps // 2, workers=1, arrive_after_s=10, **common
        ),
    ]


def rotated(speeds: list[str], r: int) -> list[str]:
    """`speeds` rotated left by `r`: repeat r's order of the workers."""
    return run_order(speeds, r)


def session(
    speeds: list[str],
    time_scale: float,
    jobs: list,
    switch_s: float,
    policy: str,
    measure=False,
    published=True,
):
    """The queue flow on `jobs` and an emulated cluster of `speeds` (presets), in order, on a
    dataset bucket of its own (an empty profile history); `measure`: the allocator profiles
    each job first (`measure_first`); not `published`: its prior is the equal split."""
    import uuid

    from hetflow.config import ClusterSpec, DatasetSpec
    from hetflow.flows.job_queue import queue

    cluster = ClusterSpec.from_speeds(speeds, name="queue-real", time_scale=time_scale)
    dataset = DatasetSpec(url=f"s3://hetflow-queue-bench-{uuid.uuid4().hex[:8]}/digits")
    return queue(
        jobs=jobs,
        cluster=cluster,
        dataset=dataset,
        switch_s=switch_s,
        read_inbox=False,
        policy=policy,
        measure_first=measure,
        published_prior=published,
    )


def summary(out: dict, order: list[str], first: str) -> dict:
    """One session's figures, as the comparison reports them."""
    fig, rows = out["figures"], out["jobs"]
    train = sum(r["train_s"] for r in rows)
    launch = sum(r["launch_s"] for r in rows)
    return {
        "policy": out["policy"],
        "workers": order,
        "ran_first": first,
        "avg_job_completion_s": round(fig["avg_job_completion_s"], 1),
        "makespan_s": round(fig["makespan_s"], 1),
        "high_wait_s": next(r["wait_s"] for r in rows if r["job"] == "high"),
        "wait_s": {r["job"]: r["wait_s"] for r in rows},
        "completion_s": {r["job"]: r["completion_s"] for r in rows},
        "train_s": round(train, 1),
        "launch_s": round(launch, 1),
        "train_over_launch": round(train / launch, 2) if launch > 0 else None,
        "segments": int(fig["segments"]),
        "steps_redone": fig["steps_redone"],
        "measuring_s": round(fig["measuring_s"], 1),
        "moves_in_place": int(fig.get("moves_in_place", 0)),
        "grows_in_place": int(fig.get("grows_in_place", 0)),
        "warm_ranks": int(fig.get("warm_ranks", 0)),  # ranks started on the session's pool
        "moves": out.get("moves", []),
        "units": out.get("units", []),
        "run_id": out["parent_run_id"],
    }


def aggregate(runs: list[dict]) -> dict:
    """Per policy, each figure's median over the repeats with its min-max (each job's wait and
    completion too); the allocator's average completion over FIFO's, per repeat and as a
    median with min-max."""
    out: dict = {}
    labels = [p for p in (*POLICIES, *VARIANTS) if any(r["policy"] == p for r in runs)]
    for policy in labels:
        mine = [r for r in runs if r["policy"] == policy]
        row: dict = {}
        for name in FIGURES:
            row[name], row[f"{name}_range"] = median_spread(r[name] for r in mine)
        for per in ("wait_s", "completion_s"):
            # a job that failed in a session has no figure there (its reason is in the log)
            jobs = list(dict.fromkeys(j for r in mine for j in r[per]))
            row[per] = {j: median_spread(r[per].get(j) for r in mine) for j in jobs}
        out[policy] = row
    by_repeat: dict[int, dict[str, float]] = {}
    for r in runs:
        by_repeat.setdefault(r["repeat"], {})[r["policy"]] = r["avg_job_completion_s"]
    for label in labels[1:]:
        ratios = [
            round(v[label] / v["fifo"], 3)
            for _, v in sorted(by_repeat.items())
            if {label, "fifo"} <= set(v)
        ]
        median, spread = median_spread(ratios)
        out[f"{label}_vs_fifo"] = {"per_repeat": ratios, "median": median, "range": spread}
    moves = [m for r in runs for m in r.get("moves", [])]
    out["moves_in_place"] = {
        k: median_spread(m[k] for m in moves if m[k] is not None) if moves else None
        for k in ("free_s", "giver_s", "taker_s")
    } | {"count": len(moves)}
    grown = [m["taker_s"] for m in moves if m.get("grown") and m["taker_s"] is not None]
    launched = [m["taker_s"] for m in moves if not m.get("grown") and m["taker_s"] is not None]
    out["taker_s"] = {  # the taking side: a running job grown in place, or a launch on it
        "grown": median_spread(grown) if grown else None,
        "launched": median_spread(launched) if launched else None,
    }
    return out


def compare_real(
    speeds: str,
    time_scale: float,
    steps: int,
    switch_s: float,
    repeats: int,
    case: str = "three",
    in_place: bool = True,
    measure_first: bool = False,
    equal_prior: bool = False,
):
    """`repeats` rounds of both policies on `case`'s jobs, and of the allocator measuring
    first where `measure_first` (`MEASURED`), from the equal split where `equal_prior`
    (`EQUAL`; see the module)."""
    kinds = speeds.split(",")
    jobs = real_jobs(steps, case=case, in_place=in_place)
    labels = [*POLICIES] + [MEASURED] * measure_first + [EQUAL] * equal_prior
    runs = []
    for r in range(repeats):
        order = rotated(kinds, r)
        names = run_order(labels, r)
        for label in names:
            policy = "allocator" if label in VARIANTS else label
            out = session(order, time_scale, jobs, switch_s, policy, **VARIANTS.get(label, {}))
            runs.append({"repeat": r, **summary(out, order, names[0]), "policy": label})
            print({k: v for k, v in runs[-1].items() if k not in ("run_id", "completion_s")})
    return {"runs": runs, "aggregate": aggregate(runs)}
