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
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hetflow.emulation.emulator import Emulator, now
from hetflow.records import (
    CacheCounts,
    EvalPoint,
    RankResult,
    Recovery,
    RunResult,
    StepRecord,
)
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
from hetflow.training.loop_state import LoopState
from hetflow.training.models import build_model, parameter_count
from hetflow.training.partition import Stream
from hetflow.training.probes import profile
from hetflow.training.progress import ProgressFile, note_recovery
from hetflow.training.scheduler import SUDDEN_STEPS, Rebalancer
from hetflow.training.step_times import SharedStepTimes, column_means


def straggler_factor(stragglers: list[tuple[int, int, float]], rank: int, step: int) -> float:
    """The factor on `rank`'s slowdown at `step`: that of the last (rank, onset, factor) entry
    for this rank whose onset has come, in the order listed; 1.0 before any."""
    factor = 1.0
    for r, at, f in stragglers:
        if r == rank and step >= at:
            factor = f
    return factor


@dataclass
class Net:
    """The model, DDP over it with the comm hook, the optimizer, and the hook's state."""

    model: nn.Module
    ddp: DDP
    opt: torch.optim.Optimizer
    hook_state: Any


def build_net(spec: RunSpec, data: RankData, emu: Emulator) -> Net:
    """The model at the run's seed, DDP with the plan's comm hook (its compute phase dilated by
    `emu`), and the configured optimizer wrapped as the hook needs."""
    cfg = spec.train
    model = build_model(cfg.model, data.manifest.features, data.manifest.classes, cfg.seed)
    # Gradients live in DDP's buckets: no copy between them each step, a copy that a worker's
    # compute phase would otherwise pay (and the emulator dilate).
    ddp = DDP(model, gradient_as_bucket_view=True)
    hook_state = register_compression(ddp, spec.plan.compression, emu.dilating_hook)
    if cfg.optimizer == "sgd":
        opt = torch.optim.SGD(ddp.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    else:
        opt = torch.optim.Adam(ddp.parameters(), lr=cfg.lr)
    opt = wrap_optimizer(opt, spec.plan.compression, hook_state)
    return Net(model, ddp, opt, hook_state)


def new_rebalancer(spec: RunSpec, world: int) -> Rebalancer:
    """A re-balancer that starts from the plan's step model and the workers' memory caps."""
    cfg, plan = spec.train, spec.plan
    caps = [w.memory_cap_batch for w in spec.cluster.workers]
    latency = list(plan.latency_s) or [0.0] * world
    return Rebalancer(
        cfg.global_batch,
        caps,
        latency,
        list(plan.per_sample_s) or None,
        threshold=cfg.rebalance_threshold,
    )


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Accuracy of `model` on (x, y), in eval mode; the model is left in train mode."""
    model.eval()
    with torch.no_grad():
        acc = (model(x).argmax(1) == y).float().mean().item()
    model.train()
    return acc


class TrainingLoop:
    """One rank's training run, resumed from the newest checkpoint if there is one.

    Every rank runs the same loop and so issues the same collectives in the same order (DDP's,
    the shared step times, the evaluation barrier, the checkpoint's gather), which gloo needs.
    Every rank re-plans from the same shared figures, so all reach the same plan at the same
    step. Rank 0 alone evaluates, saves checkpoints, and writes progress.json and recovery.json.
    """

    def __init__(
        self, spec: RunSpec, data: RankData, rank: int, world: int, counter: WireCounter
    ) -> None:
        cfg = self.cfg = spec.train
        self.spec, self.data, self.rank, self.world, self.counter = spec, data, rank, world, counter
        self.emu = emulator_for(spec, rank)
        self.net = build_net(spec, data, self.emu)
        every = 1 if cfg.schedule == "dynamic" else cfg.rebalance_every
        self.shared = SharedStepTimes(world, new_control_group(), every)
        self.rebalancer = new_rebalancer(spec, world)
        self.base_slowdown = self.emu.slowdown
        self.stream = Stream(data.train.y, seed=cfg.seed)
        self.xtr, self.ytr = torch.from_numpy(data.train.x), torch.from_numpy(data.train.y)
        self.xte, self.yte = torch.from_numpy(data.test.x), torch.from_numpy(data.test.y)
        self.store = CheckpointStore(spec.checkpoint_url or f"{spec.run_dir}/checkpoints")
        self.state = self.resume()
        run_dir, start = Path(spec.run_dir), self.state.start
        self.recovery = note_recovery(run_dir, start) if rank == 0 else Recovery()
        self.progress = ProgressFile(run_dir / "progress.json", start) if rank == 0 else None

    def resume(self) -> LoopState:
        """The newest checkpoint loaded into the model, optimizer, comm hook and re-balancer,
        and the loop's state from it; a fresh state on the spec's plan when there is none."""
        saved = self.store.load()
        if saved is None:
            return LoopState.fresh(self.spec.plan.local_batches)
        self.net.model.load_state_dict(saved["model"])
        self.net.opt.load_state_dict(saved["optimizer"])
        load_comm_state(self.net.hook_state, saved["comm"])
        self.rebalancer.restore(saved["rebalancer"])
        return LoopState.from_checkpoint(saved, self.rank)

    def run(self) -> None:
        cfg = self.cfg
        self.counter.take()
        for step in range(self.state.start, cfg.steps):
            rec = self.timed_step(step)
            self.record(rec)
            last = step == cfg.steps - 1
            checkpoint_now = (step + 1) % cfg.checkpoint_every == 0 and not last
            self.share(rec, flush=last or checkpoint_now)
            self.rebalance(step, flush=last or checkpoint_now, last=last)
            if (step + 1) % cfg.eval_every == 0 or last:
                self.record_eval(step + 1)
            if checkpoint_now:
                self.checkpoint(step + 1)
            self.write_progress(step + 1)

    def timed_step(self, step: int) -> StepRecord:
        """One step on the plan in force: picking its data (`data_s`); forward, backward and the
        comm hook up to its last bucket (`compute_s`, dilated by the emulator); then the
        communication, waiting for the other ranks, the optimizer and the emulated link's delay
        (`wait_s`)."""
        emu, net, world = self.emu, self.net, self.world
        emu.slowdown = self.base_slowdown * straggler_factor(self.spec.stragglers, self.rank, step)
        t0 = now()
        idx = torch.from_numpy(self.stream.step_indices(step, self.state.plan, self.rank))
        x, y = self.xtr[idx], self.ytr[idx]
        t1 = now()
        emu.start(key=len(idx))
        loss_sum = nn.functional.cross_entropy(net.ddp(x), y, reduction="sum")
        # DDP averages over ranks; scale so the result is the mean over the global batch.
        (loss_sum * world / self.cfg.global_batch).backward()
        net.opt.step()
        net.opt.zero_grad(set_to_none=True)
        nbytes, ncoll = self.counter.take()
        emu.link.delay(nbytes, ncoll)
        t3 = now()
        computed = emu.finish()  # when the comm hook ended the phase at the last bucket
        return StepRecord(
            step=step,
            batch=len(idx),
            data_s=t1 - t0,
            compute_s=computed - t1,
            wait_s=t3 - computed,
            step_s=t3 - t0,
            loss_sum=float(loss_sum.detach()),
            bytes_sent=nbytes,
        )

    def record(self, rec: StepRecord) -> None:
        state = self.state
        tb = now()
        state.records.append(rec)
        state.bookkeeping_s += now() - tb
        state.train_time_s += rec.step_s

    def share(self, rec: StepRecord, flush: bool) -> None:
        """Post this step's compute time, tagged with the plan it ran, and keep the rows that
        have come in (all of them when `flush`)."""
        self.shared.post(rec, len(self.state.plans))
        for done, tag, row in self.shared.collect(flush=flush):
            self.state.add_row(tag, done.step, row)

    def rebalance(self, step: int, flush: bool, last: bool) -> None:
        """Feed the re-balancer after a sudden change (dynamic schedule), a full window, or a
        flush; the dynamic schedule then adopts its proposal from the next step (not after
        the last)."""
        state, cfg = self.state, self.cfg
        dynamic = cfg.schedule == "dynamic"
        sudden = dynamic and self.rebalancer.sudden_change(state.current)
        window = state.window
        if not (sudden or (window and (len(window) >= cfg.rebalance_every or flush))):
            return
        # After a sudden change only the steps since it tell the new speeds.
        self.rebalancer.observe(
            state.plan, column_means(state.current[-SUDDEN_STEPS:] if sudden else window)
        )
        state.window = []
        if sudden:
            state.current = []
        if dynamic and not last:
            new = self.rebalancer.propose(state.plan, step + 1)
            if new is not None:
                state.adopt(new, step + 1)

    def record_eval(self, step: int) -> None:
        """Rank 0 evaluates on the test split; every rank waits for it, outside the timed step."""
        if self.rank == 0:
            accuracy = evaluate(self.net.model, self.xte, self.yte)
            self.state.evals.append(
                EvalPoint(step=step, train_time_s=self.state.train_time_s, accuracy=accuracy)
            )
        dist.barrier()  # the others wait here, outside the timed step

    def checkpoint(self, step: int) -> None:
        """Gather every rank's step records; rank 0 saves them with the model, optimizer, comm
        hook, re-balancer and loop state, as the checkpoint of `step` steps done."""
        everyone: list = [None] * self.world
        dist.all_gather_object(everyone, [r.model_dump() for r in self.state.records])
        if self.rank == 0:
            net = self.net
            self.store.save(
                step,
                {
                    "step": step,
                    "model": net.model.state_dict(),
                    "optimizer": net.opt.state_dict(),
                    **self.state.saved(),
                    "rebalancer": self.rebalancer.state(),
                    "comm": comm_state_dict(net.hook_state),
                    "records": everyone,
                },
            )

    def write_progress(self, step: int) -> None:
        if self.progress is not None:
            tb = now()
            self.progress.write(step)
            self.state.bookkeeping_s += now() - tb

    def result(self) -> RankResult:
        state, stats = self.state, self.data.cache.stats
        return RankResult(
            rank=self.rank,
            node=os.uname().nodename,
            records=state.records,
            plans=state.plans,
            evals=state.evals,
            replans=self.rebalancer.history,
            bytes_total=self.counter.total_bytes,
            control_bytes=self.counter.control_bytes,
            params=parameter_count(self.net.model),
            load_s=self.data.load_s,
            recovery=self.recovery,
            bookkeeping_s=state.bookkeeping_s,
            cache=CacheCounts(hits=stats.hits, misses=stats.misses, bytes_read=stats.bytes_read),
        )

    def weights(self) -> dict[str, torch.Tensor] | None:
        """A copy of the trained weights on rank 0; None elsewhere."""
        if self.rank != 0:
            return None
        return {k: v.detach().clone() for k, v in self.net.model.state_dict().items()}


def train(
    spec: RunSpec, data: RankData, rank: int, world: int, counter: WireCounter
) -> tuple[RankResult, dict[str, torch.Tensor] | None]:
    """Train to `spec.train.steps` steps; this rank's result, and rank 0's trained weights."""
    loop = TrainingLoop(spec, data, rank, world, counter)
    loop.run()
    return loop.result(), loop.weights()


def init_process_group() -> None:
    """gloo over torchrun's store, in a namespace of its own for each elastic restart.

    torchrun hands the restarted workers the same agent store; without a fresh prefix they
    read the previous round's gloo addresses and fail with 'connection refused'.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group("gloo")
        return
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    base = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=timedelta(minutes=5),
    )
    store = dist.PrefixStore(f"hetflow/attempt_{attempt}/", base)
    dist.init_process_group(
        "gloo", store=store, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"])
    )


def write_result(run_dir: Path, mode: str, ranks: list, weights: dict | None) -> None:
    """Rank 0's output: model.pt (the trained weights, if any), and result.json written whole
    (under a temporary name, then renamed): `RunResult`'s JSON for a training run (`ranks`: every
    rank's `RankResult`), `{"mode": "profile", "ranks": [...]}` for a profile."""
    if weights is not None:
        torch.save(weights, run_dir / "model.pt")
    if mode == "train":
        text = RunResult(ranks=ranks).model_dump_json()
    else:
        text = json.dumps({"mode": mode, "ranks": ranks})
    tmp = run_dir / "result.json.tmp"
    tmp.write_text(text)
    tmp.replace(run_dir / "result.json")


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
        if spec.mode == "train":
            mine, weights = train(spec, data, rank, world, counter)
        else:
            mine = profile(spec, data, rank, world, counter).model_dump(mode="json")
            weights = None
        data.cache.close()
        gathered: list = [None] * world
        dist.all_gather_object(gathered, mine)
        if rank == 0:
            write_result(Path(spec.run_dir), spec.mode, gathered, weights)
    finally:
        counter.uninstall()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
