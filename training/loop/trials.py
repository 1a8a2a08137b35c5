"""'auto' by measurement: at the start of a run every candidate method (the plan's
`compression_candidates`) is tried for a few steps on the run's own process group, emulated
devices and links, and the one with the shortest step is kept, as cuDNN's benchmark mode picks
a kernel (docs/concepts.md, "Compression and `auto`").

Each candidate trains a throwaway replica (the recipe's model at the run's seed, its own DDP,
hook, optimizer, loss scale and emulator) on the run's first `TRIAL_STEPS` batches; its step is
the slowest rank's mean timed step, so every rank holds the same table and makes the same
choice. Torch's random state and the wire counts are then restored: the run trains as if the
chosen method had been set from the start. A candidate that raises on every rank is recorded
as failed and skipped; one that fails on some ranks only fails the run, as a failed step does.
An uncompressed first candidate is probed first, on PROBE_STEPS steps, and the candidates are
tried only where that can pay: the communication the probe measured, over the run's steps, must
outweigh their trials (`Trials.not_worth_trying`); else the first is kept on its probe.
"""

from __future__ import annotations

import math
import statistics
from time import perf_counter as now

import torch
import torch.distributed as dist

from hetflow.records import LOCAL_SGD, CompressionMethod, CompressionTrials, MethodTrial
from hetflow.training.devices import MixedPrecision, to_device
from hetflow.training.launch.spec import RunSpec
from hetflow.training.loop.micro import micro_cap
from hetflow.training.loop.net import build_net
from hetflow.training.loop.rank_step import Stepper
from hetflow.training.loop.weighting import MeanOverCounts
from hetflow.training.plan.compression import (
    TRIAL_STEPS,
    TRIAL_TIMED_STEPS,
    TRIAL_UNTIMED_STEPS,
    TRIAL_WARMUP_STEPS,
    choose_from_trials,
)
from hetflow.training.rank import RankContext
from hetflow.training.recipes import Recipe

# An uncompressed first candidate is probed first on this many steps (one untimed: DDP
# rebuilds its buckets after it), enough to tell whether trying the others can pay.
PROBE_STEPS = 3
NOT_WITH_FP16 = "not tried: fp16's loss scale needs the gradient all-reduced every step"


class Trials:
    """What the trials of one rank share: the rank (`RankContext`: its spec's plan has the
    candidates and local batches), the recipe, the control group of the loss's count
    (`MeanOverCounts.group`; None where it is fixed), and the control group the ranks agree on
    the table over (`new_control_group`; None: the default group)."""

    def __init__(
        self, ctx: RankContext, recipe: Recipe, count_group=None, control_group=None
    ) -> None:
        self.spec, self.data, self.recipe, self.amp = ctx.spec, ctx.data, recipe, ctx.amp
        self.counter, self.rank, self.count_group = ctx.counter, ctx.rank, count_group
        self.control_group = control_group
        self.world = ctx.world
        self.clocks = ctx.clocks  # a compute-phase clock per trial, the worker's factory

    def run(self) -> CompressionTrials:
        """Try every candidate in the plan's order; the table every rank agrees on and the
        method kept (`choose_from_trials`). Every rank must call it."""
        methods = list(self.spec.plan.compression_candidates)
        if not methods:
            raise ValueError("plan.compression_candidates: no method to try")
        cuda = [torch.device(self.amp.device)] if self.amp.device.startswith("cuda") else []
        self.comm_s: list[float] = []  # per method tried: its timed steps' mean communication
        with self.counter.apart(), torch.random.fork_rng(devices=cuda):
            plan = self.spec.plan
            probe = plan.compression_probe and methods[0].name == "none" and len(methods) > 1
            batches = self.first_batches(PROBE_STEPS if probe else TRIAL_STEPS)
            own = [
                self.try_method(methods[0], batches, untimed=1 if probe else TRIAL_UNTIMED_STEPS)
            ]
            skip = self.not_worth_trying(methods, own[0]) if probe else ""
            if probe and not skip:  # worth it: every candidate, the first too, a trial each
                self.comm_s, batches = [], self.first_batches(TRIAL_STEPS)
                own = [self.try_method(methods[0], batches)]
            if not skip:
                own += [self.try_method(m, batches) for m in methods[1:]]
            trials = self.agree(methods[: len(own)], own)
        chosen, reason = choose_from_trials(trials)
        return CompressionTrials(
            trials=trials, steps=TRIAL_TIMED_STEPS, chosen=chosen, reason=skip or reason
        )

    def not_worth_trying(
        self, methods: list[CompressionMethod], first: tuple[float, float, float, str]
    ) -> str:
        """Why the candidates are not tried after an uncompressed first one's probe, or '':
        trying them costs about a trial's steps each at the probe's step, and no method saves
        more than the communication the probe measured, over the run's steps. The slowest
        rank's step, and the least wait after compute of any rank (the slowest rank's:
        communication alone, no idle), the same on every rank (a collective: every rank calls
        it)."""
        figures = torch.tensor([first[0], -self.comm_s[0]], dtype=torch.float64)
        dist.all_reduce(figures, op=dist.ReduceOp.MAX, group=self.control_group)
        step_s, comm_s = figures[0].item(), -figures[1].item()
        cost = len(methods) * TRIAL_STEPS * step_s
        most = comm_s * self.spec.train.steps
        if not math.isfinite(step_s) or most > cost:
            return ""
        return (
            f"the first candidate, none ({step_s * 1e3:.1f} ms a step in its probe), kept "
            f"without trials of the {len(methods) - 1} others: they could save at most its "
            "communication, "
            f"{comm_s * 1e3:.1f} ms a step, {most:.1f} s over the run's "
            f"{self.spec.train.steps} steps, less than the {cost:.1f} s of trying them"
        )

    def first_batches(self, steps: int = TRIAL_STEPS) -> list[tuple[tuple, int]]:
        """This rank's batches of the run's first `steps` steps on the plan, on the device,
        each with its sample count; read by a reader of their own (the run's keeps its place)."""
        cfg, plan = self.spec.train, self.spec.plan.local_batches
        reader = self.data.reader(self.rank, cfg.seed)
        try:
            out = []
            for step in range(steps):
                xs, ys = reader.batch(step, plan)
                out.append((to_device(self.recipe.batch(xs, ys), self.amp.device), len(ys)))
            return out
        finally:
            reader.close()

    def try_method(
        self, method: CompressionMethod, batches: list, untimed: int = TRIAL_UNTIMED_STEPS
    ) -> tuple[float, float, float, str]:
        """(mean timed step s, mean bytes sent per timed step, the timed steps' standard
        deviation, '') of `method` on this rank over `batches`, the first `untimed` not timed;
        (inf, 0, 0, why) where it cannot run or raised."""
        amp = self.amp
        if method.name in LOCAL_SGD and amp.scaler.is_enabled():
            self.comm_s.append(0.0)
            return float("inf"), 0.0, 0.0, NOT_WITH_FP16
        emu = self.clocks(f"trial-{method}")
        try:
            net = build_net(
                self.spec,
                self.data,
                emu,
                self.recipe,
                amp.device,
                method,
                rank=self.rank,
                warmup_steps=TRIAL_WARMUP_STEPS,
                density_stage_steps=0,
            )
            scaled = MixedPrecision(amp.device, amp.precision, scaled=amp.scaler.is_enabled())
            accumulate = self.spec.train.accumulate == "auto"
            mean = MeanOverCounts(
                self.world, self.recipe.count_per_sample, self.count_group, accumulate=accumulate
            )
            cap = micro_cap(self.spec, self.rank)
            stepper = Stepper(net, emu, mean, scaled, self.counter, self.recipe, cap)
            times, sent, comms = [], [], []
            plan = list(self.spec.plan.local_batches)
            for step, (batch, n) in enumerate(batches):
                if step == untimed:  # time the method's settled steps alone:
                    emu.forget()  # dilation uses a batch's least CPU time; a dense step's is less
                emu.at_step(step)
                t0 = now()
                _, _, nbytes = stepper.step(batch, n, plan)
                computed, t1 = emu.finish(), now()
                if step >= untimed:
                    times.append(t1 - t0)
                    comms.append(t1 - computed)
                    sent.append(nbytes)
        except Exception as e:  # recorded as the trial's failure
            self.comm_s.append(0.0)
            return float("inf"), 0.0, 0.0, f"{type(e).__name__}: {e}"
        self.comm_s.append(statistics.fmean(comms))
        spread = statistics.stdev(times) if len(times) > 1 else 0.0
        return statistics.fmean(times), statistics.fmean(sent), spread, ""

    def agree(
        self, methods: list[CompressionMethod], own: list[tuple[float, float, float, str]]
    ) -> list[MethodTrial]:
        """Every rank's figures reduced with MAX (the slowest rank's step and spread; a failure
        anywhere is infinite): the same table on every rank."""
        figures = torch.tensor([[s, b, d] for s, b, d, _ in own], dtype=torch.float64)
        dist.all_reduce(figures, op=dist.ReduceOp.MAX, group=self.control_group)
        trials = []
        for m, (step_s, nbytes, spread), (*_, error) in zip(
            methods, figures.tolist(), own, strict=True
        ):
            failed = step_s == float("inf")
            trials.append(
                MethodTrial(
                    method=m,
                    step_s=None if failed else step_s,
                    spread_s=0.0 if failed else spread,
                    bytes_per_step=0.0 if failed else nbytes,
                    error=(error or "failed on another rank") if failed else "",
                )
            )
        return trials


def resolve_compression(
    ctx: RankContext,
    recipe: Recipe,
    saved: CompressionTrials | None,
    count_group=None,
    control_group=None,
) -> tuple[RunSpec, CompressionTrials | None]:
    """For 'auto' (the plan of `ctx.spec` lists `compression_candidates`): the spec whose plan
    carries the chosen method and why, and the trials' table and choice, run now (`Trials`,
    which every rank must run) or the resumed checkpoint's `saved` (a resumed run keeps its
    method). The spec as it is, and None, where the plan sets the method."""
    spec = ctx.spec
    if not spec.plan.compression_candidates:
        return spec, None
    trials = saved if saved is not None else Trials(ctx, recipe, count_group, control_group).run()
    if ctx.rank == 0:
        print(f"compression 'auto' -> {trials.chosen}: {trials.reason}", flush=True)
    chosen = {"compression": trials.chosen, "compression_reason": trials.reason}
    return spec.model_copy(update={"plan": spec.plan.model_copy(update=chosen)}), trials
