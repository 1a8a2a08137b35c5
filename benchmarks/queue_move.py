"""`hetflow bench queue --move`: what a move in place costs the job that gives the worker up,
and the job that takes it, on real processes, without the queue's session around it.

An elastic job (`faults.on_loss: continue`, `digits-mlp`) on two emulated workers; once it has
reached step `at`, the launcher's handle (`training.launch.live`, as the queue reaches it) is
asked to release one rank, which leaves at the next step boundary. Measured from the request,
polling every few milliseconds: the worker's process ended (`free_s`: the worker is free for
another job), and the job stepping again on the rank it kept (`giver_s`: its progress past the
step it had reached when the worker was gone); the regroup itself as the rank recorded it
(`regroup_s`, `MembershipChange`). Rank 0 and rank 1 are released in turn over the repeats
(rank 0 leaving hands its part to rank 1). Then the taking side: the same worker added back
at once (`Handle.add`, as the queue grows a job onto a worker, its warm worker taking the
slot), timed from that request to it in a generation (`joined_s`) and to the job stepping
past the step it had then (`taker_s`); `move_s`, both sides one after the other (the giver's
`giver_s` and the taker's `taker_s`). Reported: each repeat, and each figure's median with
its min-max. What the queue's session adds (its tick) is in the session's own figures
(`queue.json`'s moves, `bench queue --real`).
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from pathlib import Path

from hetflow.repeats import median_spread


def _step(run_dir: Path) -> int:
    try:
        return int(json.loads((run_dir / "progress.json").read_text())["step"])
    except (FileNotFoundError, ValueError, KeyError):
        return -1


def _mover(run_dir: Path, rank: int, at: int, out: dict, worker: str) -> None:
    """Release `rank` (the worker `worker`) once the job in `run_dir` has reached step `at`;
    time what follows; then add it back in place (`_grow`)."""
    from hetflow.training.launch.live import live_job

    deadline = time.monotonic() + 600
    members = None
    while time.monotonic() < deadline and members is None:
        found = live_job(run_dir)
        if found is not None and _step(run_dir) >= at:
            members = found
        time.sleep(0.005)
    if members is None:
        return
    t = time.monotonic()
    members.release(rank)
    while not members.gone(rank):
        time.sleep(0.002)
    out["free_s"], gone_at = time.monotonic() - t, _step(run_dir)
    while _step(run_dir) <= gone_at:
        time.sleep(0.002)
    out["giver_s"] = time.monotonic() - t
    _grow(members, run_dir, worker, out)


def _grow(members, run_dir: Path, worker: str, out: dict) -> None:
    """`worker` added back to the job in place at once (the queue's `Moves.grow`, the warm
    worker taking its slot); timed to it in a generation (`joined_s`) and to the job
    stepping past the step it had then (`taker_s`)."""
    t = time.monotonic()
    rank = members.add(worker)
    deadline = t + 120
    while not members.joined(rank) and time.monotonic() < deadline:
        time.sleep(0.002)
    out["joined_s"], at = time.monotonic() - t, _step(run_dir)
    while _step(run_dir) <= at and time.monotonic() < deadline:
        time.sleep(0.002)
    out["taker_s"] = time.monotonic() - t


def one_move(folder: Path, rank: int, steps: int, at: int, time_scale: float) -> dict:
    """One elastic run on two workers with `rank` released at step `at` (see the module)."""
    from hetflow.config import ClusterSpec, DatasetSpec
    from hetflow.config.queue import QueueJob
    from hetflow.infra.data.format import digits_source, write_dataset
    from hetflow.records import Plan, RunResult
    from hetflow.training.launch.run import run_workers
    from hetflow.training.launch.spec import RunSpec

    data = folder / "digits"
    if not data.exists():
        (data / "train").mkdir(parents=True)
        (data / "test").mkdir()
    dataset = DatasetSpec(url=data.as_uri(), cache_dir=str(folder / "cache"))
    write_dataset(dataset.url, digits_source(dataset.test_fraction, dataset.seed), 256)
    job = QueueJob(name="move", recipe="digits-mlp", global_batch=256, steps=steps, in_place=True)
    train = job.train_config()  # a warm worker for the join, as the session's pool keeps one
    train = train.model_copy(update={"faults": train.faults.model_copy(update={"warm_workers": 1})})
    run_dir = folder / f"run-{time.monotonic_ns()}"
    spec = RunSpec(
        run_name=run_dir.name,
        variant="move",
        cluster=ClusterSpec.from_speeds([1, 1], time_scale=time_scale),
        dataset=dataset,
        train=train,
        plan=Plan.equal([128, 128]),
        run_dir=str(run_dir),
    )
    out: dict = {"released": rank}
    worker = spec.cluster.workers[rank].name
    mover = threading.Thread(target=_mover, args=(run_dir, rank, at, out, worker), daemon=True)
    mover.start()
    raw, _ = run_workers(spec)
    mover.join(timeout=5)
    lead = RunResult.model_validate(raw).lead
    changes = lead.recovery.membership
    out["regroup_s"] = changes[0].regroup_s if changes else None
    out["at_step"] = changes[0].step if changes else None
    out["joins"] = [c.step for c in changes if c.joined]
    if "taker_s" in out:  # the whole move: both sides, one after the other
        out["move_s"] = out["giver_s"] + out["taker_s"]
    out["steps_done"] = [r.step for r in lead.records] == list(range(steps))
    return out


def measure_moves(repeats: int, steps: int = 200, at: int = 20, time_scale: float = 20.0):
    """`repeats` moves (see the module): each repeat's figures and the medians."""
    runs = []
    with tempfile.TemporaryDirectory(prefix="hetflow-move-") as tmp:
        for r in range(repeats):
            runs.append(one_move(Path(tmp), r % 2, steps, at, time_scale))
            print(runs[-1])
    summary = {}
    for name in ("free_s", "giver_s", "regroup_s", "joined_s", "taker_s", "move_s"):
        values = [x[name] for x in runs if x.get(name) is not None]
        summary[name], summary[f"{name}_range"] = median_spread(values)
    return {"runs": runs, "median": summary}
