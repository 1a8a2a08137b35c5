"""One rank's training loop (`TrainingLoop`), resumed from the newest checkpoint: a loop over
named components, each in a module of its own."""

from __future__ import annotations

from pathlib import Path
from time import perf_counter as now

import torch

from hetflow.infra.data.reader import peak_rss_bytes
from hetflow.records import (
    CacheCounts,
    CompressionTrials,
    RankResult,
    Recovery,
    StepRecord,
    Timeline,
)
from hetflow.training.comm import new_control_group
from hetflow.training.devices import peak_device_bytes
from hetflow.training.elastic.loop import ElasticLoop, replica_digest
from hetflow.training.elastic.world import joins_running_job
from hetflow.training.faults.guard import StepGuard
from hetflow.training.faults.records import Preempted
from hetflow.training.launch.spec import node_id, since_submit
from hetflow.training.loop.checkpointer import Checkpointer, CheckpointParts
from hetflow.training.loop.compute_times import SharedStepTimes
from hetflow.training.loop.evaluator import Evaluator
from hetflow.training.loop.loop_step import LoopStepper
from hetflow.training.loop.membership import Membership
from hetflow.training.loop.optim import build_scheduler, step_scheduler
from hetflow.training.loop.progress import ProgressFile, note_recovery, write_points
from hetflow.training.loop.rebalancing import Rebalancing, share_every
from hetflow.training.loop.stop_channel import channel_of
from hetflow.training.loop.stop_request import StopRequest
from hetflow.training.loop.strategies import StepParts, strategy_of
from hetflow.training.loop.trials import resolve_compression
from hetflow.training.loop.weighting import MeanOverCounts
from hetflow.training.metrics import THROUGHPUT_SKIP_STEPS
from hetflow.training.plan.rounds import loop_counts
from hetflow.training.rank import RankContext
from hetflow.training.recipes import parameter_count, recipe_of


class TrainingLoop:
    """One rank's training run, resumed from the newest checkpoint if there is one, its
    learning rate warmed up by a scheduler stepped once per step (`optim.build_scheduler`).

    A loop over components built once, each owning its state:
    the checkpointer (`checkpointer.Checkpointer`: resume and save), the strategy's model and
    optimizer (`net`) and the stepper on its step (`stepper.LoopStepper`: each timed step),
    both from `train.strategy`'s registered builders (`strategies.strategy_of`), the
    re-balancer (`rebalancing.Rebalancing`: step times shared, the plan revised), the
    membership of computing ranks (`membership.Membership`: who is in the gradient's
    all-reduce) and the evaluator (`evaluator.Evaluator`). The compute-phase clock (the
    emulator) and the wire counter are the worker's hooks, in the `RankContext`.

    Every rank runs the same loop and so issues the same collectives in the same order ('auto''s
    compression trials first, then DDP's, the shared step times, the count's all-reduce when
    the recipe's count varies per sample, the evaluation barrier, the checkpoint's gather),
    which gloo needs.
    Every rank re-plans from the same shared figures, so all reach the same plan at the same
    step. A rank the plan leaves out (batch 0) leaves the gradient's all-reduce where it can
    (`computing.ComputingRanks`): its steps then wait for the others' (`LoopStepper.idle_step`).
    Rank 0 alone evaluates, saves checkpoints (under fsdp every rank writes its shards first),
    and writes progress.json and recovery.json.
    """

    def __init__(self, ctx: RankContext) -> None:
        self.ctx = ctx
        self.cfg = ctx.train  # resolved before launch: its optimizer, its rounds
        self.counts = loop_counts(self.cfg)  # steps, or under diloco rounds
        self.spec = ctx.spec
        self.data = ctx.data
        self.rank = ctx.rank
        self.world = ctx.world
        self.amp = ctx.amp
        self.counter = ctx.counter
        self.emu = ctx.emu  # the worker's: its link already attached to the counter
        self.recipe = ctx.recipe or recipe_of(self.cfg)  # the worker's, made once
        every = share_every(self.cfg)
        self.shared = SharedStepTimes(self.world, new_control_group(), every)
        self.mean = count_mean(self.world, self.recipe.count_per_sample, self.cfg.accumulate)
        self.checkpointer = Checkpointer(self.spec, self.rank, self.world)
        self.timeline = Timeline()
        self.trials = self.choose_compression()  # 'auto': self.spec's plan now has it
        self.stepper = self.build_strategy()
        self.lr_schedule = build_scheduler(self.net.opt, self.cfg)
        self.rebalancing = Rebalancing(self.spec, self.world, self.shared)
        self.rebalancer = self.rebalancing.rebalancer
        timeout_s = self.cfg.stall_timeout_s
        self.membership = Membership(
            self.world, self.rank, self.net, self.amp, self.mean, every, timeout_s
        )
        self.evaluator = Evaluator(self.spec, self.rank, self.net, self.recipe, self.data)
        parts = CheckpointParts(self.net, self.amp, self.rebalancer, self.lr_schedule, self.trials)
        self.state = self.checkpointer.resume(parts)
        if self.rank == 0 and joins_running_job():  # the rank that took rank 0's part keeps it
            self.evaluator.rank = self.checkpointer.rank = -1
        self.recovery = self.note_recovery()
        self.progress = self.open_progress()
        self.points_written = 0  # the re-balancer's windows when points.json was last written
        self.guard = StepGuard(self.spec, self.rank, self.net)  # last: every process group exists
        slack = self.guard.preemption.slack  # how far ahead of rank 0 a rank may run
        every = self.counts.checkpoint_every
        self.stop_request = StopRequest(channel_of(self.spec), self.rank, every, slack)
        self.elastic = ElasticLoop.attach(self) if self.cfg.faults.on_loss == "continue" else None

    def run(self) -> None:
        """Train from the resumed step to `train.steps` (or to the checkpoint a stop request
        names: `stop_asked`), one step per `turn`. Under `faults.on_loss: continue` a turn that
        fails because a peer is lost (`training.elastic.ElasticLoop.recovers`) regroups the
        ranks left and goes on from the step they were at: the step in flight again, where no
        rank applied it, else the next."""
        cfg, line, state = self.counts, self.timeline, self.state
        first = state.start
        self.stepper.warm_up(state)
        self.counter.take()
        line.first_step, line.first_step_s = first, since_submit(self.spec)
        line.steady_from_s = line.first_step_s
        step = first
        while step < cfg.steps:
            try:
                if self.turn(step, first):
                    break
                step += 1
            except Exception as e:  # only a lost peer is recovered from: the rest re-raised
                if self.elastic is None or not self.elastic.recovers(e):
                    raise
                step = self.elastic.recover(self, e, step)
        line.loop_end_s = since_submit(self.spec)
        if self.elastic is not None:
            self.elastic.world.store.set("over", "1")  # a worker still asking to join: too late
            self.recovery.replica_digest = replica_digest(self.net.model)

    def turn(self, step: int, first: int) -> bool:
        """One turn of the loop; True after the run's last step.

        the step (the stepper's, or an idle one where this rank is out of the all-reduce), the
        lr scheduler's step, the replicas' average after the last; the guard's verdict (a
        skipped step, a SIGTERM every rank agrees on); the step's record; the re-balancer's
        turn and the membership that follows its plan; then, between steps and outside their
        time, an evaluation every `eval_every` steps and at the end, a checkpoint every
        `checkpoint_every` steps and before a preemption, and progress.json. Raises
        `Preempted` after the checkpoint of the step a SIGTERM stopped at."""
        cfg, line, state, stepper = self.counts, self.timeline, self.state, self.stepper
        if self.elastic is not None:  # a worker that got SIGTERM leaves here
            self.elastic.at_boundary(self, step)
        last = step == cfg.steps - 1 or self.stop_asked(step + 1)
        if step == first + THROUGHPUT_SKIP_STEPS:  # the steps throughput counts begin
            line.steady_from_s = since_submit(self.spec)
        self.guard.begin(step)
        computes = self.membership.computes
        rec = stepper.step(step, state) if computes else stepper.idle_step(step, state)
        step_scheduler(self.lr_schedule)  # every rank: its position is the steps run
        if last:
            stepper.last_average(rec)
        stop = self.guard.end(rec, step + 1)  # every rank alike: SIGTERM came
        # the optimizer's or the loss scale's skip, on a step this rank stepped in
        rec.skipped = computes and (rec.skipped or self.amp.last_skipped)
        self.record(rec)
        # the last step too where it falls on the interval: a run continued to more steps
        # (the queue's next segment, on the same run directory) resumes there
        checkpoint_now = (step + 1) % cfg.checkpoint_every == 0 or (stop and not last)
        flush = last or checkpoint_now
        self.rebalancing.after(rec, state, flush=flush, last=last, posted=not computes)
        self.membership.follow(state, step + 1)
        self.boundary(step + 1, last, checkpoint_now)
        if stop and not last:
            raise Preempted(step + 1)
        return last

    def boundary(self, done: int, last: bool, checkpoint_now: bool) -> None:
        """After `done` steps, outside their time: the replicas synced where ranks were left
        out, an evaluation every `eval_every` steps and at the end (`last`), the checkpoint
        (`checkpoint_now`), and progress.json."""
        line, state = self.timeline, self.state
        evaluate_now = done % self.counts.eval_every == 0 or last
        self.membership.refresh(state, rank0=evaluate_now or checkpoint_now, everyone=last)
        if evaluate_now:
            line.eval_s += self.timed(self.evaluator.evaluate, done, state)
        if checkpoint_now:
            line.checkpoint_s += self.timed(self.checkpointer.save, done, state)
        self.write_progress(done)
        self.write_points(done)

    def write_points(self, done: int) -> None:
        """Rank 0's points.json (`progress.write_points`) once the re-balancer has observed a
        window since it last wrote: each worker's points, by the name the run's cluster gives
        the rank."""
        rb = self.rebalancer
        if self.progress is None or rb.points is None or rb.windows == self.points_written:
            return
        self.points_written = rb.windows
        names = [w.name for w in self.spec.cluster.workers]
        points = {names[r]: p for r, p in enumerate(rb.points) if p and r < len(names)}
        tb = now()
        write_points(Path(self.spec.run_dir), done, points)
        self.state.bookkeeping_s += now() - tb

    def choose_compression(self) -> CompressionTrials | None:
        """'auto''s trials, or the checkpoint's (`trials.resolve_compression`): `self.spec`'s
        plan then carries the chosen method; the trials' time in the timeline (none when
        resumed)."""
        saved = self.checkpointer.saved
        t = since_submit(self.spec)
        self.spec, trials = resolve_compression(
            self.ctx, self.recipe, saved and saved.trials, self.mean.group, self.shared.group
        )
        self.timeline.trials_s = since_submit(self.spec) - t if trials and not saved else 0.0
        return trials

    def build_strategy(self) -> LoopStepper:
        """The model and optimizer of `train.strategy` (`self.net`) and the stepper of its
        steps, by its registered builders (`strategies.strategy_of`)."""
        strategy = strategy_of(self.cfg.strategy)
        device = self.amp.device
        self.net = strategy.build_net(
            self.spec, self.data, self.emu, self.recipe, device, rank=self.rank
        )
        parts = StepParts(
            self.spec, self.rank, self.emu, self.mean, self.amp, self.counter, self.recipe
        )
        stepper = strategy.build_stepper(self.net, parts)
        return LoopStepper(self.ctx, self.net, stepper, parts, self.shared)

    def note_recovery(self) -> Recovery:
        """Rank 0's count of this run's restarts (`progress.note_recovery`), with the workers
        the run goes on without; the latter alone elsewhere."""
        start = self.state.start
        lead = self.rank == 0 and not joins_running_job()
        recovery = note_recovery(Path(self.spec.run_dir), start) if lead else Recovery()
        recovery.left_out = dict(self.spec.left_out)
        return recovery

    def open_progress(self) -> ProgressFile | None:
        """Rank 0's progress.json, from the resumed step; None elsewhere (and on a worker
        that joins a running job in rank 0's slot: the rank that took its part writes it)."""
        if self.rank != 0 or joins_running_job():
            return None
        return ProgressFile(Path(self.spec.run_dir) / "progress.json", self.state.start)

    def timed(self, fn, *args) -> float:
        """The wall seconds `fn(*args)` took."""
        t = since_submit(self.spec)
        fn(*args)
        return since_submit(self.spec) - t

    def record(self, rec: StepRecord) -> None:
        state = self.state
        tb = now()
        state.records.append(rec)
        state.bookkeeping_s += now() - tb
        state.train_time_s += rec.step_s

    def stop_asked(self, boundary: int) -> bool:
        """Whether the run ends at `boundary` (steps done), a checkpoint, before its last
        step: the checkpoint a stop request (the queue moving or cancelling the job, through
        the run's `stop_channel`) came to, agreed by every rank (`stop_request.StopRequest`)."""
        return self.stop_request.asked(boundary)

    def write_progress(self, step: int) -> None:
        if self.progress is not None:
            tb = now()
            self.progress.write(step)
            self.state.bookkeeping_s += now() - tb

    def result(self) -> RankResult:
        state, stats = self.state, self.data.cache.stats
        return RankResult(
            rank=self.rank,
            node=node_id(),
            worker=self.worker_name(),
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
            peak_rss_bytes=peak_rss_bytes(),
            state_bytes=self.net.state_bytes(),
            peak_device_bytes=peak_device_bytes(self.net.device),
            trials=self.trials,
            timeline=self.timeline,
        )

    def worker_name(self) -> str:
        """The worker this rank ran as: the one the elastic launcher started in its slot
        (`ElasticWorld.worker`), else its slot's in the launched cluster."""
        world = self.elastic.world if self.elastic is not None else None
        return (world and world.worker) or self.spec.cluster.workers[self.rank].name

    def weights(self) -> dict[str, torch.Tensor] | None:
        """A copy of the trained weights on rank 0 (under `on_loss: continue`, the lowest rank
        left); None elsewhere (every rank calls it: under fsdp they are gathered from every
        rank's shards)."""
        weights = self.net.weights()
        if self.rank != (0 if self.elastic is None else self.elastic.world.leader):
            return None
        return {k: v.detach().to("cpu", copy=True) for k, v in weights.items()}


def count_mean(world: int, per_sample: int | None, accumulate: str) -> MeanOverCounts:
    """The loss's mean over the global batch's counts (`MeanOverCounts`): its count
    all-reduced on a control group of its own where the recipe's count varies per sample."""
    group = None if per_sample else new_control_group()
    return MeanOverCounts(world, per_sample, group, accumulate=accumulate == "auto")


def train(ctx: RankContext) -> tuple[RankResult, dict[str, torch.Tensor] | None]:
    """Train to `spec.train.steps` steps on the rank's device and precision; this rank's
    result, and rank 0's trained weights (on the CPU)."""
    loop = TrainingLoop(ctx)
    if ctx.startup is not None:
        ctx.startup.mark("model")  # the model built: the warm-up and the first step next
    loop.run()
    return loop.result(), loop.weights()
