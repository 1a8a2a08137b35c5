"""What a worker that joins a running job in place receives from a live peer, the generation's
leader (`send_state`, `receive_state`): the weights, the optimizer's and lr scheduler's state,
the loss scale, the re-balancer's state and the loop's plan and plans, and the step it goes on
from. The data position is the step and the plan: a rank's batch at step s is a function of
(s, plan) (`infra.data.reader.RankData.batch`), so no sampler state travels.

Two messages, point to point on the new generation's group (`send_object_list`): a header
(the step, the plan), then the state. Only the leader and the joiner take part; a joiner
that dies or a leader that stalls between them fails the transfer on the other side (a
closed connection, or the group's timeout), and the members regroup without them
(`loop.ElasticLoop`). Where `torchft` sends a checkpoint over HTTP from a healthy replica, the
job's own group serves here: it is made for the join anyway, and nothing else listens."""

from __future__ import annotations

import os
import signal
from time import perf_counter as now

import torch.distributed as dist

from hetflow.training.comm import comm_state_dict, load_comm_state


def _fire(loop, kind: str, step: int) -> None:
    """A test's injected fault of `kind` on this rank, at a join at or after its step
    (`launch.spec.Injection`): SIGKILL or SIGSTOP of this process."""
    for f in loop.spec.inject:
        if f.rank == loop.rank and f.kind == kind and step >= f.step:
            sig = signal.SIGKILL if kind == "kill_receiving" else signal.SIGSTOP
            os.kill(os.getpid(), sig)


def state_of(loop) -> dict:
    """What the joiner loads: the parts a checkpoint holds, but the step records and the
    evaluations (the leader's own)."""
    net, state = loop.net, loop.state
    return {
        "model": net.model.state_dict(),
        "optimizer": net.opt.state_dict(),
        "scheduler": loop.lr_schedule.state_dict(),
        "scaler": loop.amp.state_dict(),
        "comm": comm_state_dict(net.hook_state),
        "rebalancer": loop.rebalancer.state(),
        "plans": state.plans,
        "train_time_s": state.train_time_s,
    }


def send_state(loop, world, joiner: int, step: int) -> dict[str, float]:
    """The leader's side: the header, then the state, to rank `joiner`; seconds by phase."""
    t0 = now()
    dist.send_object_list([{"step": step, "plan": loop.state.plan}], dst=joiner, group=world.group)
    _fire(loop, "stop_sending", step)
    t1 = now()
    dist.send_object_list([state_of(loop)], dst=joiner, group=world.group)
    return {"header_s": round(t1 - t0, 4), "state_s": round(now() - t1, 4)}


def receive_state(loop, world, step: int) -> dict[str, float]:
    """The joiner's side: the header and the state from the leader, loaded into the loop's
    parts; its state set to go on from `step`. Seconds by phase."""
    t0 = now()
    box: list = [None]
    dist.recv_object_list(box, src=world.leader, group=world.group)
    header = box[0]
    if header["step"] != step:
        raise RuntimeError(f"the leader sends step {header['step']}, not {step}")
    _fire(loop, "kill_receiving", step)
    t1 = now()
    dist.recv_object_list(box, src=world.leader, group=world.group)
    t2 = now()
    load_state(loop, box[0], header["plan"], step)
    return {
        "header_s": round(t1 - t0, 4),
        "state_s": round(t2 - t1, 4),
        "load_s": round(now() - t2, 4),
    }


def load_state(loop, sent: dict, plan: list[int], step: int) -> None:
    """`sent` (`state_of`) loaded into the loop's parts; its state on `plan` from `step`."""
    net, state = loop.net, loop.state
    net.load_state(sent["model"], sent["optimizer"], None)
    loop.lr_schedule.load_state_dict(sent["scheduler"])
    loop.amp.load_state_dict(sent["scaler"])
    load_comm_state(net.hook_state, sent["comm"])
    loop.rebalancer.restore(sent["rebalancer"])
    state.plan, state.plans = list(plan), list(sent["plans"])
    state.train_time_s, state.start = sent["train_time_s"], step
    state.records, state.window, state.current = [], [], []
