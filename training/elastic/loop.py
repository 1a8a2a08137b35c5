"""The training loop under `faults.on_loss: continue` (`ElasticLoop`): its collectives on the
group of the ranks still in the job (`world.ElasticWorld`), each optimizer step applied only
once every member holds the whole gradient (`CommitGate`), and, when a peer is lost, the ranks
left regrouped in place: model and optimizer kept, DDP rebuilt over the new group, the global
batch re-cut over them (`replan`), the loop going on from the step they were at."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from time import perf_counter as now

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from hetflow.records import EvalPoint, MembershipChange
from hetflow.training.comm import register_compression
from hetflow.training.elastic.admission import Admissions
from hetflow.training.elastic.departure import Departures
from hetflow.training.elastic.lost import LostStretches
from hetflow.training.elastic.shares import joiner_curve, replan
from hetflow.training.elastic.transfer import receive_state, send_state
from hetflow.training.elastic.world import ElasticWorld, LeftBehind, StepAborted, current
from hetflow.training.faults.records import STEP, failure_kind
from hetflow.training.launch.startup import process_started_at
from hetflow.training.loop.micro import micro_caps
from hetflow.training.loop.progress import ProgressFile
from hetflow.training.plan.rebalancer import Rebalancer
from hetflow.training.recipes import parameter_count

# What gloo's errors say where a peer died or did not answer (in a DDP comm hook's callback
# too, whose error wraps the collective's).
GLOO_FAILURES = ("pair closure", "Connection closed", "Connection reset", "imed out", "gloo")


class TooFewWorkers(RuntimeError):
    """Fewer workers are left than `faults.min_workers`: the job checkpointed and ended."""


class CommitGate:
    """The optimizer, stepping only on a step every member commits (`ElasticWorld.commit`);
    raises `StepAborted` otherwise, before any state changes. Everything else is the wrapped
    optimizer's (`faults.guard.FiniteGuard` wraps it the same way)."""

    def __init__(self, opt, world: ElasticWorld) -> None:
        self.opt, self.world = opt, world

    def __getattr__(self, name: str):
        return getattr(self.opt, name)

    def step(self, *args, **kwargs):
        step = STEP["now"]
        if not self.world.commit(step):
            raise StepAborted(f"step {step}: a member was lost before the gradient was whole")
        return self.opt.step(*args, **kwargs)


class ElasticLoop:
    """A `TrainingLoop`'s membership under `on_loss: continue`: built by `attach` once the
    loop's parts exist (every rank, at the same point), asked by the loop whether an exception
    is a lost peer (`recovers`) and then to regroup (`recover`)."""

    def __init__(self, world: ElasticWorld, min_workers: int, caps: list) -> None:
        self.world, self.min_workers = world, min_workers
        self.caps = list(caps)  # every slot's memory cap: a joiner's comes back with it
        self.departures = Departures(world)
        self.admissions = Admissions(world)
        self.leaver: int | None = None  # a rank leaving on SIGTERM: it keeps its own result

    @classmethod
    def attach(cls, loop) -> ElasticLoop:
        """The loop's collectives moved onto the world's group (the worker made it: generation
        0's, short timeouts), the optimizer gated, ranks kept in the all-reduce with a share of
        0 (no subgroups of the old world). A late rank joins here (`enter`); where generation
        0 lacks late ranks, the plan is re-cut over its members."""
        faults = loop.cfg.faults
        world = current()
        if world is None or world.rank != loop.rank:
            world = ElasticWorld(loop.rank, loop.world, faults.collective_timeout_s)
        self = cls(world, faults.min_workers, loop.rebalancer.caps)
        self.departures.publish = lambda: loop.result().model_dump_json()  # kept on a leave
        self.lost = LostStretches(world, loop.shared, loop.state.start, micro_caps(loop.spec))
        world.keep_timeout()
        loop.membership.computing.can_leave = False
        loop.net.opt = CommitGate(loop.net.opt, world)
        if world.joining:
            self.enter(loop, max(60.0, loop.cfg.stall_timeout_s))
            return self
        self.rewire(loop, rebuild=True)  # DDP on the short-timeout group from the start
        state = loop.state
        if any(state.plan[r] for r in range(loop.world) if r not in world.members):
            self.zero_caps(loop.rebalancer)
            plan = replan(loop.rebalancer, state.plan, world.members, loop.cfg.global_batch)
            state.adopt(plan, state.start)
        return self

    def enter(self, loop, patience_s: float) -> None:
        """This late rank joins the running job: admitted at the members' next boundary
        (`ElasticWorld.join`), the state received from the leader (`transfer`), DDP and the
        loop's collectives on the new group, the plan re-cut with it; the change recorded with
        the join's seconds by phase (from its asking). Leaves the process (status 3: the
        launcher announces it) where no generation took it or the transfer failed."""
        t0, world = now(), self.world
        phases = ready_phases(loop)
        try:
            step = world.join(patience_s)
            t1 = now()
            phases |= {"admit_s": round(t1 - t0, 4), **receive_state(loop, world, step)}
            t2 = now()
            self.rewire(loop, rebuild=True)
            phases["rebuild_s"] = round(now() - t2, 4)
        except Exception as e:  # LeftBehind, or the leader lost or stalled while sending
            print(f"rank {loop.rank}: could not join ({e}); leaving", flush=True)
            sys.stdout.flush()
            os._exit(3)
        print(f"rank {loop.rank}: joined {list(world.members)} at step {step}", flush=True)
        self.settle(loop, step, t0, "none", (), [loop.rank], phases)

    def recovers(self, exc: BaseException) -> bool:
        """Whether `exc` is a peer lost or stalled (a failed or timed-out collective, a step
        no member applied), which the ranks left recover from."""
        if isinstance(exc, StepAborted) or failure_kind(exc) in ("peer_lost", "timed_out"):
            return True
        text = str(exc)
        return isinstance(exc, RuntimeError) and any(m in text for m in GLOO_FAILURES)

    def recover(self, loop, exc: BaseException, step: int) -> int:
        """Regroup after `exc` in step `step`: the step not applied by any member where this
        rank had not applied it (then it runs again), else the next (`regroup`); returns the
        step to go on from."""
        t0, world, records = now(), self.world, loop.state.records
        # committed here, or done without a commit (the loss scale skipped it on every rank)
        applied = (world.committed is not None and world.committed >= step) or bool(
            records and records[-1].step == step
        )
        if not applied:
            world.abort(step)
        going_on = step + 1 if applied else step
        return self.settled(loop, going_on, t0, "none" if applied else "retried", str(exc))

    def at_boundary(self, loop, step: int) -> None:
        """Before step `step`: a worker that got SIGTERM leaves here, where every rank agreed
        (`departure.Departures`), and a worker that asked to join is admitted here
        (`admission.Admissions`); the others regroup without the one, with the other."""
        who = self.departures.leaving(step)
        joiner = self.admissions.admitting(step)
        if who is None and joiner is None:
            return
        why = f"rank {who} left on SIGTERM" if who is not None else f"rank {joiner} joins"
        self.leaver = who
        self.settled(loop, step, now(), "none", why)

    def settled(self, loop, going_on: int, t0: float, in_flight: str, why: str) -> int:
        """`regroup`, again where the regroup itself failed for a peer lost (a joiner killed
        while it receives the state, the sender stalled while it sends it, a member lost
        meanwhile), at most as many times as the job has ranks; returns `going_on`."""
        for _ in range(loop.world):
            try:
                return self.regroup(loop, going_on, t0, in_flight, why)
            except Exception as e:
                if not self.recovers(e):
                    raise
                why = f"the regroup failed: {e}"
        return self.regroup(loop, going_on, t0, in_flight, why)

    def regroup(self, loop, going_on: int, t0: float, in_flight: str, why: str) -> int:
        """The new generation agreed (with the joiner this generation admitted, if any), the
        state sent to a rank that joined, the loop's collectives and DDP moved onto it, the
        global batch re-cut over its ranks from step `going_on` on, the change recorded (`t0`:
        when this rank saw the failure; `in_flight`: what became of the step it interrupted).
        Returns `going_on`. Leaves the process where the others went on without this rank;
        raises `TooFewWorkers` (after a checkpoint) below `faults.min_workers`. Where rank 0
        was lost, the lowest rank left takes its part (`take_the_lead`)."""
        world, before = self.world, self.world.members
        pending = self.admissions.pending()
        try:
            lost = world.regroup(going_on, admit=() if pending is None else (pending,))
        except LeftBehind as e:  # it stalled; the others went on: leave without a failure
            print(f"rank {loop.rank}: {e}; leaving the job", flush=True)
            sys.stdout.flush()
            os._exit(0)
        self.keep_lost(loop, lost)
        self.departures.asked = False  # a leave asked in the last generation: asked again
        joined = [m for m in world.members if m not in before]
        print(
            f"rank {loop.rank}: lost {list(lost)}, joined {joined} ({why}); going on with "
            f"{list(world.members)} from step {going_on}",
            flush=True,
        )
        phases: dict[str, float] = {}
        if loop.rank == world.leader:
            for j in joined:
                phases = send_state(loop, world, j, going_on)
        loop.net.opt.zero_grad(set_to_none=True)
        t2 = now()
        self.rewire(loop, rebuild=True)
        if joined:
            phases["rebuild_s"] = round(now() - t2, 4)
        if loop.rank == world.leader and loop.progress is None:  # rank 0 was lost
            take_the_lead(loop, going_on)
        return self.settle(loop, going_on, t0, in_flight, lost, joined, phases)

    def keep_lost(self, loop, lost: tuple[int, ...]) -> None:
        """On the new generation's leader, the stretches of the ranks `lost` (killed,
        stalled; not a leaver on SIGTERM, which left its own) rebuilt from the step times
        this rank holds and kept in the store (`lost.LostStretches.publish`): at once, so
        that a regroup that fails after this one has them. The step times in flight are
        dropped first, those already in kept: after the new generation is agreed, by when
        the last step's, sent before the loss, has most often come in."""
        loop.shared.drop()
        gone, self.leaver = [r for r in lost if r != self.leaver], None
        if gone and loop.rank == self.world.leader:
            params = parameter_count(loop.net.model)
            self.lost.publish(self.world.store, gone, loop.state.plans, params)

    def settle(self, loop, going_on, t0, in_flight, lost, joined, phases) -> int:
        """After a regroup (or a join, on the joiner): the leader's re-balancer state and
        plan (`resync`), a joiner's curve (`joiner_curve`), the global batch re-cut over the
        members from `going_on`, the change recorded (the ranks that joined followed:
        `lost.LostStretches.follow`); the end checks of `regroup`."""
        world, state = self.world, loop.state
        self.resync(loop)
        for j in joined:
            joiner_curve(loop.rebalancer, j, world.members, loop.spec)
        plan = replan(
            loop.rebalancer, state.plan, world.members, loop.cfg.global_batch, loop.spec.plan
        )
        state.adopt(plan, going_on)
        change = MembershipChange(
            step=going_on,
            lost=list(lost),
            world=len(world.members),
            step_in_flight=in_flight,
            regroup_s=round(now() - t0, 4),
            plan=plan,
            joined=list(joined),
            join_s=phases,
            workers={m: n for m in world.members if (n := world.worker_of(m))},
        )
        loop.recovery.membership.append(change)
        self.lost.follow(change)
        if len(world.members) < self.min_workers:
            loop.checkpointer.save(going_on, state)
            raise TooFewWorkers(
                f"{len(world.members)} worker(s) left, fewer than faults.min_workers "
                f"{self.min_workers}: checkpointed at step {going_on}"
            )
        if going_on >= loop.cfg.steps:  # the last step was done: its evaluation and checkpoint
            loop.boundary(going_on, last=True, checkpoint_now=True)
        return going_on

    def rewire(self, loop, rebuild: bool) -> None:
        """The loop's collectives onto the current generation's group: the shared step times
        (their unsent and in-flight rows dropped, those already in kept), the count's
        all-reduce, the evaluation's barrier, the checkpoint's gather; with `rebuild`, DDP over
        it too (its reducer may have been mid-step), with a fresh comm hook of the plan's
        method on the group."""
        group, members = self.world.group, self.world.members
        shared = loop.shared
        shared.drop()  # those already in kept (`SharedStepTimes.kept`)
        shared.group, shared.members = group, members
        mean = loop.mean
        mean.world, mean._pending = len(members), None
        if mean.group is not None:
            mean.group = group
        loop.evaluator.group = group
        loop.checkpointer.group, loop.checkpointer.members = group, members
        if rebuild:
            rebuild_ddp(loop, group)

    def resync(self, loop) -> None:
        """The re-balancer's state and the loop's plan and rows made the leader's: an in-flight
        gather of step times may have come in on some ranks and not others."""
        state, rebalancer = loop.state, loop.rebalancer
        box = [
            {
                "rebalancer": rebalancer.state(),
                "plan": state.plan,
                "plans": state.plans,
                "window": state.window,
                "current": state.current,
            }
        ]
        dist.broadcast_object_list(box, self.world.leader, group=self.world.group)
        theirs = box[0]
        if loop.rank != self.world.leader:
            rebalancer.restore(theirs["rebalancer"])
            state.plan, state.plans = theirs["plan"], theirs["plans"]
            state.window, state.current = theirs["window"], theirs["current"]
        self.zero_caps(rebalancer)
        rebalancer.trial = rebalancer.revert_to = rebalancer.pending = None

    def zero_caps(self, rebalancer: Rebalancer) -> None:
        """The re-balancer's caps: 0 for a slot not in the generation, its own for a member."""
        for r in range(len(rebalancer.caps)):
            rebalancer.caps[r] = self.caps[r] if r in self.world.members else 0


def ready_phases(loop) -> dict[str, float]:
    """A joiner's figures when it is ready to ask: `ready_step`, the steps the job had done
    (its progress.json), and `start_s`, the seconds from its assignment to a warm worker (or
    its process's start) to here: its rendezvous, data and model."""
    out: dict[str, float] = {}
    with contextlib.suppress(OSError, ValueError, KeyError):
        out["ready_step"] = json.loads((Path(loop.spec.run_dir) / "progress.json").read_text())[
            "step"
        ]
    began = os.environ.get("HETFLOW_ASSIGNED_AT")
    started = float(began) if began else process_started_at()
    if started is not None:
        out["start_s"] = round(time.time() - started, 4)
    return out


def take_the_lead(loop, step: int) -> None:
    """This rank does what rank 0 did, rank 0 being lost: it evaluates and writes the
    checkpoints (its evaluator and checkpointer act as rank 0's), progress.json from `step`,
    and the result (`world.result_group`'s first rank). Rank 0's evaluations come back from
    its last checkpoint; those it made after it are lost with it."""
    loop.evaluator.rank = loop.checkpointer.rank = 0
    loop.progress = ProgressFile(Path(loop.spec.run_dir) / "progress.json", step)
    saved = loop.checkpointer.store.load()  # rank 0's evaluations, up to its last checkpoint
    if saved is not None:
        loop.state.evals = [EvalPoint.model_validate(e) for e in saved.get("evals", [])]
    print(f"rank {loop.rank}: takes rank 0's part (evaluation, checkpoints, result)", flush=True)


def replica_digest(model: torch.nn.Module) -> str:
    """A digest of `model`'s state (its tensors' bytes, in order): equal on ranks whose
    replicas are equal."""
    h = hashlib.sha256()
    for tensor in model.state_dict().values():
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def rebuild_ddp(loop, group) -> None:
    """`loop.net`'s DDP made anew over `group`, the plan's comm hook on it (a stateless one:
    `check_elastic`), its gradients' buffers fresh; the model and optimizer kept."""
    net = loop.net
    device = net.device
    ids = [torch.device(device)] if device != "cpu" else None
    old, net.ddp = net.ddp, None
    del old
    ddp = DDP(net.model, device_ids=ids, process_group=group, gradient_as_bucket_view=True)
    nodes = [w.node for w in loop.spec.cluster.workers]
    hook_state = register_compression(
        ddp, loop.spec.plan.compression, loop.emu.dilating_hook, nodes=nodes
    )
    hook_state.group = group
    net.ddp, net.hook_state = ddp, hook_state
