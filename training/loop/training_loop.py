"""One rank's training loop (`TrainingLoop`), resumed from the newest checkpoint."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from hetflow.emulation.emulator import now
from hetflow.infra.data.reader import peak_rss_bytes
from hetflow.records import (
    CacheCounts,
    CompressionTrials,
    EvalPoint,
    RankResult,
    Recovery,
    StepRecord,
    Timeline,
)
from hetflow.training.comm import (
    comm_state_dict,
    finish_optimizer,
    load_comm_state,
    new_control_group,
)
from hetflow.training.devices import peak_device_bytes, synchronizer, to_device
from hetflow.training.faults.guard import StepGuard
from hetflow.training.faults.records import Preempted
from hetflow.training.launch.spec import emulator_for, node_id, since_submit
from hetflow.training.loop.checkpoint import CheckpointStore
from hetflow.training.loop.computing import ComputingRanks, can_leave, sync_replicas
from hetflow.training.loop.optim import build_scheduler, resolve_optimizer, step_scheduler
from hetflow.training.loop.progress import ProgressFile, note_recovery
from hetflow.training.loop.rebalancing import rebalance
from hetflow.training.loop.state import Checkpoint, LoopState
from hetflow.training.loop.step import (
    MeanOverCounts,
    Stepper,
    build_net,
    micro_cap,
    micro_count,
    new_rebalancer,
    split_batch,
    straggler_factor,
)
from hetflow.training.loop.step_times import SharedStepTimes
from hetflow.training.loop.trials import Trials
from hetflow.training.metrics import THROUGHPUT_SKIP_STEPS
from hetflow.training.rank import RankContext
from hetflow.training.recipes import evaluate, parameter_count, recipe_of


class TrainingLoop:
    """One rank's training run, resumed from the newest checkpoint if there is one, its
    learning rate warmed up by a scheduler stepped once per step (`optim.build_scheduler`).

    Every rank runs the same loop and so issues the same collectives in the same order ('auto''s
    compression trials first, then DDP's, the shared step times, the count's all-reduce when
    the recipe's count varies per sample, the evaluation barrier, the checkpoint's gather),
    which gloo needs.
    Every rank re-plans from the same shared figures, so all reach the same plan at the same
    step. A rank the plan leaves out (batch 0) leaves the gradient's all-reduce where it can
    (`computing.ComputingRanks`): its steps then wait for the others' (`idle_step`). Rank 0
    alone evaluates, saves checkpoints (under fsdp every rank writes its shards first), and
    writes progress.json and recovery.json.
    """

    def __init__(self, ctx: RankContext) -> None:
        spec, data, rank, world, amp = ctx.spec, ctx.data, ctx.rank, ctx.world, ctx.amp
        self.ctx, cfg = ctx, ctx.train
        self.cfg, self.spec, self.data, self.rank, self.world = cfg, spec, data, rank, world
        self.counter, self.amp, counter = ctx.counter, amp, ctx.counter
        self.emu = emulator_for(spec, rank, synchronizer(amp.device))
        counter.link = self.emu.link  # from here (trials too) collectives cost the link's time
        self.recipe = recipe_of(cfg)
        every = 1 if cfg.schedule == "dynamic" else cfg.rebalance_every
        self.shared = SharedStepTimes(world, new_control_group(), every)
        per_sample = self.recipe.count_per_sample
        accumulate = cfg.accumulate == "auto"
        group = None if per_sample else new_control_group()
        self.mean = MeanOverCounts(world, per_sample, group, accumulate=accumulate)
        self.store = CheckpointStore(spec.checkpoint_url or f"{spec.run_dir}/checkpoints")
        saved = self.on_these_workers(self.store.load())
        self.timeline = Timeline()
        t = since_submit(spec)
        self.trials = self.resolve_compression(saved)  # 'auto': self.spec's plan now has it
        self.timeline.trials_s = since_submit(spec) - t if self.trials and not saved else 0.0
        spec = self.spec
        self.net = build_net(spec, data, self.emu, self.recipe, amp.device, rank=rank)
        cap = micro_cap(spec, rank)
        self.stepper = Stepper(self.net, self.emu, self.mean, amp, counter, self.recipe, cap)
        self.lr_schedule = build_scheduler(self.net.opt, resolve_optimizer(cfg, self.recipe))
        self.rebalancer = new_rebalancer(spec, world)
        self.computing = ComputingRanks(
            world, rank, can_leave(self.net, every), timeout_s=cfg.stall_timeout_s
        )
        self.base_slowdown = self.emu.slowdown
        self.s3_bytes_seen = data.cache.stats.bytes_read  # before the run's reads (trials')
        self.reader = data.reader(rank, cfg.seed)  # this rank's share of each step, streamed
        self.first_batch: tuple | None = None  # (step, plan, xs, ys) read by `warm_up`
        self.state = self.resume(saved)
        run_dir, start = Path(spec.run_dir), self.state.start
        self.recovery = note_recovery(run_dir, start) if rank == 0 else Recovery()
        self.recovery.left_out = dict(spec.left_out)
        self.progress = ProgressFile(run_dir / "progress.json", start) if rank == 0 else None
        self.guard = StepGuard(spec, rank, self.net)  # last: every process group exists

    def on_these_workers(self, saved: dict | None) -> Checkpoint | None:
        """The store's newest checkpoint `saved` for this run's workers: as saved where it was
        taken on them, else narrowed onto them with the spec's plan (`Checkpoint.narrowed`:
        the run went on without the workers of a lost node)."""
        names = [w.name for w in self.spec.cluster.workers]
        if saved is None:
            return None
        ckpt = Checkpoint.from_dict(saved, names)
        if ckpt.workers == names:
            return ckpt
        if self.rank == 0:
            print(
                f"rank 0: resuming step {ckpt.step} of {ckpt.workers} on {names}, "
                f"local batches {self.spec.plan.local_batches}",
                flush=True,
            )
        return ckpt.narrowed(names, self.spec.plan.local_batches)

    def resolve_compression(self, saved: Checkpoint | None) -> CompressionTrials | None:
        """For 'auto' (the plan lists `compression_candidates`): the trials' table and choice,
        run now (`trials.Trials`), or the resumed checkpoint's `saved` (a resumed run keeps its
        method); `self.spec`'s plan then carries the chosen method and why. None, and the plan
        as it is, where the plan sets the method."""
        plan = self.spec.plan
        if not plan.compression_candidates:
            return None
        if saved is not None and saved.trials is not None:
            trials = saved.trials
        else:
            trials = Trials(self.ctx, self.recipe, self.mean.group, self.shared.group).run()
        if self.rank == 0:
            print(f"compression 'auto' -> {trials.chosen}: {trials.reason}", flush=True)
        chosen = {"compression": trials.chosen, "compression_reason": trials.reason}
        self.spec = self.spec.model_copy(update={"plan": plan.model_copy(update=chosen)})
        return trials

    def resume(self, saved: Checkpoint | None) -> LoopState:
        """The checkpoint `saved` (the store's newest) loaded into the model, optimizer, comm
        hook and re-balancer, and the loop's state from it; a fresh state on the spec's plan
        when there is none."""
        if saved is None:
            return LoopState.fresh(self.spec.plan.local_batches)
        saved.check_strategy(self.cfg.strategy)
        shards = self.store.at(saved.shards) if saved.shards else None
        self.net.load_state(saved.model, saved.optimizer, shards)  # fsdp: re-sharded
        load_comm_state(self.net.hook_state, saved.comm)
        self.amp.load_state_dict(saved.scaler)
        self.rebalancer.restore(saved.rebalancer)
        if saved.scheduler is not None:
            self.lr_schedule.load_state_dict(saved.scheduler)
        return LoopState.from_checkpoint(saved, self.rank)

    def warm_up(self) -> None:
        """Before the first timed step, its batch read (kept for that step: the data is read
        once) and one untimed pass on it (`Stepper.warm_up`), on a rank the plan gives samples;
        the same for every variant, counted in the run's start-up, not its steps. None under
        fsdp: a sharded model has no pass without collectives, which a rank with no samples
        would not join."""
        first, plan = self.state.start, self.state.plan
        if plan[self.rank] == 0 or first >= self.cfg.steps or self.net.sharded:
            return
        xs, ys = self.reader.batch(first, plan)
        self.first_batch = (first, list(plan), xs, ys)
        batch = to_device(self.recipe.batch(xs, ys), self.net.device)
        self.stepper.warm_up(split_batch(batch, len(ys), self.stepper.cap)[0])  # what fits

    def run(self) -> None:
        cfg = self.cfg
        self.warm_up()
        self.counter.take()
        line, first = self.timeline, self.state.start
        line.first_step, line.first_step_s = first, since_submit(self.spec)
        line.steady_from_s = line.first_step_s
        for step in range(first, cfg.steps):
            if step == first + THROUGHPUT_SKIP_STEPS:  # the steps throughput counts begin
                line.steady_from_s = since_submit(self.spec)
            self.guard.begin(step)
            computes = self.computing.computes
            rec = self.timed_step(step) if computes else self.idle_step(step)
            step_scheduler(self.lr_schedule)  # every rank: its position is the steps run
            if step == cfg.steps - 1:
                self.last_average(rec)
            stop = self.guard.end(rec, step + 1)  # every rank alike: SIGTERM came
            # the optimizer's or the loss scale's skip, on a step this rank stepped in
            rec.skipped = computes and (rec.skipped or self.amp.last_skipped)
            self.record(rec)
            last = step == cfg.steps - 1
            checkpoint_now = ((step + 1) % cfg.checkpoint_every == 0 or stop) and not last
            self.share(rec, flush=last or checkpoint_now, posted=not computes)
            self.rebalance(step, flush=last or checkpoint_now, last=last)
            self.follow(self.state.plan, step + 1)
            evaluate_now = (step + 1) % cfg.eval_every == 0 or last
            self.refresh(rank0=evaluate_now or checkpoint_now, everyone=last)
            if evaluate_now:
                line.eval_s += self.timed(self.record_eval, step + 1)
            if checkpoint_now:
                line.checkpoint_s += self.timed(self.checkpoint, step + 1)
            self.write_progress(step + 1)
            if stop and not last:
                raise Preempted(step + 1)
        line.loop_end_s = since_submit(self.spec)

    def timed(self, fn, *args) -> float:
        """The wall seconds `fn(*args)` took."""
        t = since_submit(self.spec)
        fn(*args)
        return since_submit(self.spec) - t

    def timed_step(self, step: int) -> StepRecord:
        """One step on the plan in force: picking its data (`data_s`); forward, backward and the
        comm hook up to its last bucket (`compute_s`, dilated by the emulator); then the
        communication not overlapped with backward (each bucket's collective carried by the
        emulated link from where DDP issued it), waiting for the other ranks and the optimizer
        (`wait_s`)."""
        emu, net = self.emu, self.net
        emu.slowdown = self.base_slowdown * straggler_factor(self.spec.stragglers, self.rank, step)
        t0 = now()
        kept, self.first_batch = self.first_batch, None
        if kept is not None and kept[:2] == (step, self.state.plan):
            xs, ys = kept[2:]
        else:
            xs, ys = self.reader.batch(step, self.state.plan)
        batch = to_device(self.recipe.batch(xs, ys), net.device)
        t1 = now()
        loss_sum, count, nbytes = self.stepper.step(batch, len(ys), self.state.plan)
        t3 = now()
        computed = emu.finish()  # when the comm hook ended the phase at the last bucket
        return StepRecord(
            step=step,
            batch=len(ys),
            data_s=t1 - t0,
            compute_s=computed - t1,
            wait_s=t3 - computed,
            step_s=t3 - t0,
            loss_sum=float(loss_sum.detach()),
            count=count,
            bytes_sent=nbytes,
            s3_bytes=self.s3_bytes_since_last(),
            micro_batches=micro_count(len(ys), self.stepper.cap),
        )

    def last_average(self, rec: StepRecord) -> None:
        """After the run's last step, where replicas drifted apart since they were last
        averaged (local SGD, hierarchical averaging), their average weighted by samples
        (`finish_optimizer`): the model rank 0 evaluates and saves is every rank's, not its
        own. Its time and bytes are the last step's (`rec`)."""
        t0 = now()
        finish_optimizer(self.net.opt, self.net.model)
        nbytes, _ = self.counter.take()
        spent = now() - t0
        rec.bytes_sent += nbytes
        rec.wait_s += spent
        rec.step_s += spent

    def idle_step(self, step: int) -> StepRecord:
        """A step this rank is out of the all-reduce in (`ComputingRanks`): no samples, no
        collective of the gradient's; its record goes out with the others' at once, and the
        step ends when every rank's has come in, so that its `step_s` is the step's."""
        t0 = now()
        self.reader.batch(step, self.state.plan)  # none of its samples; the stream moves on
        t1 = now()
        self.mean.skip()
        rec = StepRecord(
            step=step,
            batch=0,
            data_s=t1 - t0,
            compute_s=0.0,
            wait_s=0.0,
            step_s=0.0,
            loss_sum=0.0,
            count=0,
            bytes_sent=0.0,
            s3_bytes=self.s3_bytes_since_last(),
        )
        self.shared.post(rec, len(self.state.plans))
        self.shared.wait_sent()
        t3 = now()
        rec.wait_s, rec.step_s = t3 - t1, t3 - t0
        return rec

    def s3_bytes_since_last(self) -> int:
        """Bytes this rank's cache fetched from S3 since the previous step (prefetches too)."""
        total = self.data.cache.stats.bytes_read
        new, self.s3_bytes_seen = total - self.s3_bytes_seen, total
        return new

    def record(self, rec: StepRecord) -> None:
        state = self.state
        tb = now()
        state.records.append(rec)
        state.bookkeeping_s += now() - tb
        state.train_time_s += rec.step_s

    def share(self, rec: StepRecord, flush: bool, posted: bool = False) -> None:
        """Post this step's compute time, tagged with the plan it ran (unless `posted`
        already), and keep the rows that have come in (all of them when `flush`)."""
        if not posted:
            self.shared.post(rec, len(self.state.plans))
        for done, tag, row in self.shared.collect(flush=flush):
            self.state.add_row(tag, done.step, row)

    def rebalance(self, step: int, flush: bool, last: bool) -> None:
        """The re-balancer's turn after `step` (`rebalancing.rebalance`)."""
        rebalance(self.rebalancer, self.state, self.cfg, step, flush, last)

    def follow(self, plan: list[int], first: int) -> None:
        """Run the gradient's all-reduce from step `first` on the ranks `plan` gives samples
        to, where ranks can leave it (`ComputingRanks`); a rank that returns to it takes the
        others' replica first. Ranks leave it once DDP has rebuilt its buckets (its second
        forward in this process); a plan the run started on leaves them then."""
        if not self.computing.can_leave:
            return
        src = self.computing.follow(plan, ready=first - self.state.start >= 2)
        self.net.hook_state.group = self.computing.group
        self.mean.world = self.computing.size
        if src is not None:
            self.sync_from(src)

    def refresh(self, rank0: bool, everyone: bool) -> None:
        """Where ranks are out of the all-reduce, their replicas stood still: made the computing
        ranks' when `rank0` and rank 0 is out (it evaluates or checkpoints next), or when
        `everyone` (the run's end: every rank ends with the same weights)."""
        out = self.computing.left_out
        if out and (everyone or (rank0 and out[0] == 0)):
            self.sync_from(self.computing.ranks[0])

    def sync_from(self, src: int) -> None:
        """Every rank's replica (model, optimizer, loss scale) made rank `src`'s
        (`sync_replicas`; every rank calls it); rank 0's training time too, which its evaluations
        are stamped with."""
        theirs = sync_replicas(
            self.net, self.amp, self.mean, src, train_time_s=self.state.train_time_s
        )
        self.state.train_time_s = theirs["train_time_s"]

    def record_eval(self, step: int) -> None:
        """Rank 0 evaluates on the test split (under fsdp on the weights every rank gathers for
        it); every rank waits for it, outside the timed step."""
        model = self.net.evaluation_model(self.rank)
        if self.rank == 0:
            # batches no larger than the training's: evaluation needs no more memory than a step
            recipe = self.recipe
            batches = (
                to_device(recipe.batch(x, y), self.net.device)
                for x, y in self.data.eval_batches(batch=max(self.state.plan))
            )
            figures = evaluate(recipe, model, batches)
            wall = since_submit(self.spec)
            self.state.evals.append(EvalPoint.of(step, self.state.train_time_s, figures, wall))
        dist.barrier()  # the others wait here, outside the timed step

    def checkpoint(self, step: int) -> None:
        """Gather every rank's step records; rank 0 saves them with the model, optimizer, comm
        hook, re-balancer and loop state, as the checkpoint of `step` steps done."""
        everyone: list = [None] * self.world
        dist.all_gather_object(everyone, self.state.records)
        shards = self.store.shards_name(step) if self.net.sharded else None
        model, optimizer = self.net.checkpoint_state(shards and self.store.at(shards))
        if self.rank == 0:
            net, state = self.net, self.state
            ckpt = Checkpoint(
                step=step,
                workers=[w.name for w in self.spec.cluster.workers],
                model=model,
                optimizer=optimizer,
                strategy=self.cfg.strategy,
                shards=shards,
                plan=state.plan,
                plans=state.plans,
                evals=state.evals,
                train_time_s=state.train_time_s,
                rebalancer=self.rebalancer.state(),
                comm=comm_state_dict(net.hook_state),
                trials=self.trials,
                scaler=self.amp.state_dict(),
                records=everyone,
                scheduler=self.lr_schedule.state_dict(),
            )
            self.store.save(step, ckpt.to_dict(), shards)  # after every rank's shards

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

    def weights(self) -> dict[str, torch.Tensor] | None:
        """A copy of the trained weights on rank 0; None elsewhere (every rank calls it: under
        fsdp they are gathered from every rank's shards)."""
        weights = self.net.full_state()[0] if self.net.sharded else self.net.model.state_dict()
        if self.rank != 0:
            return None
        return {k: v.detach().to("cpu", copy=True) for k, v in weights.items()}


def train(ctx: RankContext) -> tuple[RankResult, dict[str, torch.Tensor] | None]:
    """Train to `spec.train.steps` steps on the rank's device and precision; this rank's
    result, and rank 0's trained weights (on the CPU)."""
    loop = TrainingLoop(ctx)
    loop.run()
    return loop.result(), loop.weights()
