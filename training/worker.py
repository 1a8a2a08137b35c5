"""The torchrun entry point: one process per (emulated) worker, DDP over gloo.

One machine, 4 emulated workers (what `hetflow demo` runs)::

    torchrun --nproc-per-node 4 -m hetflow.training.worker --job RUN_DIR/job.json

Several nodes (c10d rendezvous; run the same line on every node)::

    torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d \\
        --rdzv-endpoint HOST:29400 --rdzv-id JOB -m hetflow.training.worker --job job.json

Rank 0 writes `result.json` (and `model.pt`) into the job's run directory.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hetflow.emulation.emulator import now
from hetflow.training.checkpoint import CheckpointStore
from hetflow.training.comm import (
    WireCounter,
    comm_state_dict,
    load_comm_state,
    new_control_group,
    register_compression,
    wrap_optimizer,
)
from hetflow.training.data import RankData, load_rank_data
from hetflow.training.job import RunSpec, emulator_for
from hetflow.training.models import build_model, parameter_count
from hetflow.training.partition import Stream
from hetflow.training.probes import profile
from hetflow.training.scheduler import SUDDEN_STEPS, Rebalancer

# Steps of the plan in force kept for `Rebalancer.sudden_change` (it compares a rank's last
# SUDDEN_STEPS with its median over the rest).
SUDDEN_ROWS = 12
# Steps that run new batch shapes, at the start and after each re-plan, pay one-off costs (the
# allocator, kernel choice): up to twice the settled time on this host. The re-balancer does not
# see them, or it takes the first settled steps for a sudden speed-up.
SETTLE_STEPS = 2

@dataclass
class StepRecord:
    step: int
    batch: int
    data_s: float
    compute_s: float
    wait_s: float  # after compute: communication, waiting for other ranks, optimizer
    step_s: float
    loss_sum: float
    bytes_sent: float
    idle_s: float = 0.0
    comm_s: float = 0.0


class SharedStepTimes:
    """Every rank's compute time of every step, shared in the background, so that no step waits.

    A rank posts each step's compute time; every `every` posts they go out in one asynchronous
    all-gather on a control group of its own (`new_control_group`: gloo runs it in the
    background, apart from the gradients' collectives), collected at the next one, by when it has
    long finished. `collect(flush=True)` sends and waits for the rest, where every step must be
    accounted for (a checkpoint, the run's end). A collected row splits its step's wait into idle
    (for the slowest rank) and communication, and feeds the re-balancer.

    The dynamic schedule shares every step (`every=1`), so that a sudden change of speed is
    acted on within a few steps (`Rebalancer.sudden_change`); the others every K steps. A
    collective per step is not free on a shared host: 4 processes on 2 vCPUs, each stepping 24
    ms of CPU work, ran 10-12% slower with it and no slower with one every 10 steps
    (`benchmarks/step_sharing.py`). torch has no per-step sharing of metrics.
    """

    def __init__(self, world: int, group, every: int) -> None:
        self.world, self.group, self.every = world, group, every
        self.unsent: list[tuple[StepRecord, int]] = []
        self.pending: list[tuple[list[tuple[StepRecord, int]], list[torch.Tensor], dist.Work]] = []

    def post(self, rec: StepRecord, tag: int) -> None:
        self.unsent.append((rec, tag))
        if len(self.unsent) >= self.every:
            self._send()

    def _send(self) -> None:
        mine = torch.tensor([rec.compute_s for rec, _ in self.unsent], dtype=torch.float64)
        out = [torch.zeros_like(mine) for _ in range(self.world)]
        self.pending.append((self.unsent, out, dist.all_gather(out, mine, group=self.group, async_op=True)))
        self.unsent = []

    def collect(self, flush: bool = False) -> list[tuple[StepRecord, int, list[float]]]:
        """(record, tag, every rank's compute time) of the steps whose gather is in, oldest first;
        the newest gather stays in flight unless `flush`."""
        if flush and self.unsent:
            self._send()
        done = []
        while len(self.pending) > (0 if flush else 1):
            entries, out, work = self.pending.pop(0)
            work.wait()
            for (rec, tag), row in zip(entries, torch.stack(out, dim=1).tolist(), strict=True):
                rec.idle_s = min(max(row) - rec.compute_s, rec.wait_s)
                rec.comm_s = rec.wait_s - rec.idle_s
                done.append((rec, tag, row))
        return done


def _column_means(rows: list[list[float]]) -> list[float]:
    return [sum(col) / len(col) for col in zip(*rows, strict=True)]


def _straggler_factor(spec: RunSpec, rank: int, step: int) -> float:
    factor = 1.0
    for r, at, f in spec.stragglers:
        if r == rank and step >= at:
            factor = f
    return factor


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


class ProgressFile:
    """progress.json, `{"step": N}`, rewritten in place every step with one fixed-width pwrite.

    The launcher polls it for the Prefect progress artifact and a restart reads it to count the
    steps redone. One pwrite costs about 1 us against 120 us for `_write_json`'s write and
    rename (5,000 calls each on this 2-core machine, idle). The file holds `start` from the
    moment it is opened, so a restart never finds it empty.
    """

    WIDTH = 12

    def __init__(self, path: Path, start: int):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        self.write(start)
        os.ftruncate(self.fd, len(self._record(start)))  # drops whatever an older format left

    def _record(self, step: int) -> bytes:
        return f'{{"step": {step:>{self.WIDTH}}}}\n'.encode()

    def write(self, step: int) -> None:
        os.pwrite(self.fd, self._record(step), 0)


def _note_recovery(spec: RunSpec, rank: int, resumed_at: int) -> dict:
    """On a start over an earlier attempt of this run, count it and the steps done again.

    An earlier attempt is torchrun's elastic restart after a worker died, or a new launch in the
    same run directory (a Prefect retry of the train task after torchrun itself died). Rank 0
    records the last completed step every step (progress.json, local to the run directory);
    what lies between the checkpoint and that step is done again.
    """
    if rank != 0:
        return {}
    run_dir = Path(spec.run_dir)
    path = run_dir / "recovery.json"
    note = json.loads(path.read_text()) if path.exists() else {"restarts": 0, "steps_redone": 0}
    progress = run_dir / "progress.json"
    if progress.exists():
        done = json.loads(progress.read_text())["step"]
        note = {"restarts": note["restarts"] + 1,
                "steps_redone": note["steps_redone"] + max(0, done - resumed_at), "resumed_at": resumed_at}
        _write_json(path, note)
        how = f"torchrun restart {os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        print(f"rank 0: {how}, resuming at step {resumed_at} ({max(0, done - resumed_at)} steps redone)",
              flush=True)
    return note


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        acc = (model(x).argmax(1) == y).float().mean().item()
    model.train()
    return acc


def train(spec: RunSpec, data: RankData, rank: int, world: int, counter: WireCounter) -> dict:
    cfg = spec.train
    emu = emulator_for(spec, rank)
    model = build_model(cfg.model, data.manifest.features, data.manifest.classes, cfg.seed)
    # Gradients live in DDP's buckets: no copy between them each step, a copy that a worker's
    # compute phase would otherwise pay (and the emulator dilate).
    ddp = DDP(model, gradient_as_bucket_view=True)
    hook_state = register_compression(ddp, spec.plan.compression, emu.dilating_hook)
    shared = SharedStepTimes(world, new_control_group(), 1 if cfg.schedule == "dynamic" else cfg.rebalance_every)
    if cfg.optimizer == "sgd":
        opt = torch.optim.SGD(ddp.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    else:
        opt = torch.optim.Adam(ddp.parameters(), lr=cfg.lr)
    opt = wrap_optimizer(opt, spec.plan.compression, hook_state)
    plan = list(spec.plan.local_batches)
    caps = [w.memory_cap_batch for w in spec.cluster.workers]
    latency = list(spec.plan.latency_s) or [0.0] * world
    rebalancer = Rebalancer(cfg.global_batch, caps, latency, list(spec.plan.per_sample_s) or None,
                            threshold=cfg.rebalance_threshold)
    base_slowdown = emu.slowdown
    stream = Stream(data.train.y, seed=cfg.seed)
    xtr, ytr = torch.from_numpy(data.train.x), torch.from_numpy(data.train.y)
    xte, yte = torch.from_numpy(data.test.x), torch.from_numpy(data.test.y)

    records: list[StepRecord] = []
    # Rows of compute times (rank by rank) of the steps run on the plan in force, its first
    # SETTLE_STEPS left out: since the plan came in or the last sudden change (`current`),
    # and since the last look at the plan (`window`).
    current: list[list[float]] = []
    window: list[list[float]] = []
    plans = [{"step": 0, "plan": list(plan)}]
    evals: list[dict] = []
    train_time = 0.0
    start = 0
    store = CheckpointStore(spec.checkpoint_url or f"{spec.run_dir}/checkpoints")
    saved = store.load()
    if saved is not None:
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        load_comm_state(hook_state, saved["comm"])
        start, plan, plans, evals = saved["step"], saved["plan"], saved["plans"], saved["evals"]
        train_time = saved["train_time"]
        rebalancer.restore(saved["rebalancer"])
        records = [StepRecord(**r) for r in saved["records"][rank]]
    recovery = _note_recovery(spec, rank, start)
    progress = ProgressFile(Path(spec.run_dir) / "progress.json", start) if rank == 0 else None
    bookkeeping = 0.0  # what recording progress costs the training loop
    counter.take()
    for step in range(start, cfg.steps):
        emu.slowdown = base_slowdown * _straggler_factor(spec, rank, step)
        t0 = now()
        idx = torch.from_numpy(stream.step_indices(step, plan, rank))
        x, y = xtr[idx], ytr[idx]
        t1 = now()
        emu.start(key=len(idx))
        loss_sum = nn.functional.cross_entropy(ddp(x), y, reduction="sum")
        # DDP averages over ranks; scale so the result is the mean over the global batch.
        (loss_sum * world / cfg.global_batch).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        nbytes, ncoll = counter.take()
        emu.link.delay(nbytes, ncoll)
        t3 = now()
        computed = emu.finish()  # when the comm hook ended the phase at the last bucket
        rec = StepRecord(step, len(idx), t1 - t0, computed - t1, t3 - computed,
                         t3 - t0, float(loss_sum.detach()), nbytes)
        tb = now()
        records.append(rec)
        bookkeeping += now() - tb
        train_time += rec.step_s
        last = step == cfg.steps - 1
        checkpoint_now = (step + 1) % cfg.checkpoint_every == 0 and not last
        shared.post(rec, len(plans))  # tagged with the plan it ran
        for done, tag, row in shared.collect(flush=last or checkpoint_now):
            if tag == len(plans) and done.step >= plans[-1]["step"] + SETTLE_STEPS:
                current = [*current[-SUDDEN_ROWS + 1:], row]
                window.append(row)
        sudden = cfg.schedule == "dynamic" and rebalancer.sudden_change(current)
        if sudden or (window and (len(window) >= cfg.rebalance_every or last or checkpoint_now)):
            # After a sudden change only the steps since it tell the new speeds.
            rebalancer.observe(plan, _column_means(current[-SUDDEN_STEPS:] if sudden else window))
            window = []
            if sudden:
                current = []
            if cfg.schedule == "dynamic" and not last:
                new = rebalancer.propose(plan, step + 1)
                if new is not None:
                    plan = new
                    plans.append({"step": step + 1, "plan": list(plan)})
                    current = []
        if (step + 1) % cfg.eval_every == 0 or last:
            if rank == 0:
                evals.append({"step": step + 1, "train_time_s": train_time,
                              "accuracy": evaluate(model, xte, yte)})
            dist.barrier()  # the others wait here, outside the timed step
        if checkpoint_now:
            everyone: list = [None] * world
            dist.all_gather_object(everyone, [asdict(r) for r in records])
            if rank == 0:
                store.save(step + 1, {
                    "step": step + 1, "model": model.state_dict(), "optimizer": opt.state_dict(),
                    "plan": plan, "plans": plans, "evals": evals, "train_time": train_time,
                    "rebalancer": rebalancer.state(),
                    "comm": comm_state_dict(hook_state),
                    "records": everyone,
                })
        if progress is not None:
            tb = now()
            progress.write(step + 1)
            bookkeeping += now() - tb
    state = {k: v.detach().clone() for k, v in model.state_dict().items()} if rank == 0 else None
    return {
        "records": [asdict(r) for r in records],
        "plans": plans,
        "evals": evals,
        "replans": rebalancer.history,
        "bytes_total": counter.total_bytes,
        "control_bytes": counter.control_bytes,
        "params": parameter_count(model),
        "state": state,
        "load_s": data.load_s,
        "recovery": recovery,
        "bookkeeping_s": bookkeeping,
        "cache": {"hits": data.cache.stats.hits, "misses": data.cache.stats.misses,
                  "bytes_read": data.cache.stats.bytes_read},
    }


def init_process_group() -> None:
    """gloo over torchrun's store, in a namespace of its own for each elastic restart.

    torchrun hands the restarted workers the same agent store; without a fresh prefix they
    read the previous round's gloo addresses and fail with 'connection refused'.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group("gloo")
        return
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                         timeout=timedelta(minutes=5))
    store = dist.PrefixStore(f"hetflow/attempt_{attempt}/", base)
    dist.init_process_group("gloo", store=store, rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", required=True, help="job.json written by the flow")
    args = parser.parse_args(argv)
    spec = RunSpec.read(args.job)
    torch.set_num_threads(spec.train.threads_per_rank)
    init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != spec.cluster.world_size:
        raise SystemExit(f"world size {world} != {spec.cluster.world_size} workers in the cluster")
    counter = WireCounter(world)
    counter.install()
    try:
        data = load_rank_data(spec.dataset)
        work = train if spec.mode == "train" else profile
        mine = work(spec, data, rank, world, counter)
        data.cache.close()
        state = mine.pop("state", None)
        gathered: list[dict] = [None] * world  # type: ignore[list-item]
        dist.all_gather_object(gathered, {"rank": rank, "node": os.uname().nodename, **mine})
        if rank == 0:
            out = Path(spec.run_dir)
            if state is not None:
                torch.save(state, out / "model.pt")
            tmp = out / "result.json.tmp"
            tmp.write_text(json.dumps({"mode": spec.mode, "ranks": gathered}))
            tmp.replace(out / "result.json")
    finally:
        counter.uninstall()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
