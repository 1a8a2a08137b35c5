"""The training loop's stepper: each step of the run timed, on the plan in force, from its
data to the optimizer (`LoopStepper.step`); a step this rank is left out of
(`LoopStepper.idle_step`); the untimed pass before the first (`warm_up`) and the replicas'
average after the last (`last_average`). One step's work is the strategy's stepper's
(`strategies.Strategy.build_stepper`)."""

from __future__ import annotations

from time import perf_counter as now

from hetflow.records import StepRecord
from hetflow.training.comm import finish_optimizer
from hetflow.training.devices import to_device
from hetflow.training.loop.compute_times import SharedStepTimes
from hetflow.training.loop.micro import micro_count, split_batch
from hetflow.training.loop.net import Net
from hetflow.training.loop.state import LoopState
from hetflow.training.loop.strategies import StepParts
from hetflow.training.plan.rounds import loop_counts
from hetflow.training.rank import RankContext


class LoopStepper:
    """One rank's steps over a run: its strategy's `stepper` on the run's model `net`
    (`Strategy.build_stepper`, from the `parts` fixed for the run: the compute-phase clock, the
    loss's mean over counts, the precision, the wire counter, the recipe), the rank's reader of
    its share of each step, the first batch read ahead by `warm_up`, and the S3 bytes seen so
    far. A rank left out of the all-reduce posts its step to `shared` itself."""

    def __init__(
        self, ctx: RankContext, net: Net, stepper, parts: StepParts, shared: SharedStepTimes
    ) -> None:
        self.spec = parts.spec
        self.rank = ctx.rank
        self.data = ctx.data
        self.counter = ctx.counter
        self.net = net
        self.stepper = stepper
        self.emu = parts.emu
        self.mean = parts.mean
        self.recipe = parts.recipe
        self.shared = shared
        self.s3_bytes_seen = ctx.data.cache.stats.bytes_read  # before the run's reads (trials')
        self.reader = ctx.data.reader(ctx.rank, self.spec.train.seed)  # its share of each step
        self.first_batch: tuple | None = None  # (step, plan, xs, ys) read by `warm_up`

    def warm_up(self, state: LoopState) -> None:
        """Before the first timed step, its batch read (kept for that step: the data is read
        once) and one untimed pass on it (`Stepper.warm_up`), on a rank the plan gives samples;
        the same for every variant, counted in the run's start-up, not its steps. None where
        the model has no pass without collectives (`Net.warms_up`: fsdp's), which a rank with
        no samples would not join."""
        first, plan = state.start, state.plan
        if (
            plan[self.rank] == 0
            or first >= loop_counts(self.spec.train).steps
            or not self.net.warms_up
        ):
            return
        xs, ys = self.reader.batch(first, plan)
        self.first_batch = (first, list(plan), xs, ys)
        batch = to_device(self.recipe.batch(xs, ys), self.net.device)
        self.stepper.warm_up(split_batch(batch, len(ys), self.stepper.cap)[0])  # what fits

    def step(self, step: int, state: LoopState) -> StepRecord:
        """One step on the plan in force: picking its data (`data_s`); forward, backward and the
        comm hook up to its last bucket (`compute_s`, dilated by the emulator); then the
        communication not overlapped with backward (each bucket's collective carried by the
        emulated link from where DDP issued it), waiting for the other ranks and the optimizer
        (`wait_s`)."""
        emu = self.emu
        emu.at_step(step)  # an emulated straggler's factor at this step
        t0 = now()
        kept, self.first_batch = self.first_batch, None
        if kept is not None and kept[:2] == (step, state.plan):
            xs, ys = kept[2:]
        else:
            xs, ys = self.reader.batch(step, state.plan)
        batch = to_device(self.recipe.batch(xs, ys), self.net.device)
        t1 = now()
        loss_sum, count, nbytes = self.stepper.step(batch, len(ys), state.plan)
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
            inner_steps=getattr(self.stepper, "inner_steps", 0),
        )

    def idle_step(self, step: int, state: LoopState) -> StepRecord:
        """A step this rank is out of the all-reduce in (`membership.Membership`): no samples,
        no collective of the gradient's; its record goes out with the others' at once, and the
        step ends when every rank's has come in, so that its `step_s` is the step's."""
        t0 = now()
        self.reader.batch(step, state.plan)  # none of its samples; the stream moves on
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
        self.shared.post(rec, len(state.plans))
        self.shared.wait_sent()
        t3 = now()
        rec.wait_s, rec.step_s = t3 - t1, t3 - t0
        return rec

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

    def s3_bytes_since_last(self) -> int:
        """Bytes this rank's cache fetched from S3 since the previous step (prefetches too)."""
        total = self.data.cache.stats.bytes_read
        new, self.s3_bytes_seen = total - self.s3_bytes_seen, total
        return new
