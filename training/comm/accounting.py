"""Wire-byte accounting: what each collective puts on the wire from this rank, and which
process groups stay off the emulated network link.

torch offers no per-collective callback, so `WireCounter` wraps `torch.distributed.all_reduce`,
`all_gather` and `all_gather_into_tensor` (and FSDP2's sharded collectives, `sharded_names`)
for the life of a worker; every hook and model averager calls them through the module, so
every collective is charged. With an emulated link
attached (`WireCounter.link`, during training), each collective over the network also costs
the link's time where it is issued: an asynchronous one (a DDP bucket's) completes that much
later while backward goes on, a blocking one (local SGD's averaging) blocks that much longer.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from time import perf_counter as now  # the emulated link's clock (`Link.occupy`)
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from hetflow.perf.collective import ring_allreduce_bytes

if TYPE_CHECKING:  # the worker attaches the link (`training.worker.install_clocks`)
    from hetflow.emulation.link import Link

# Process groups whose members share a node: their traffic does not use the emulated link.
_INTRA_NODE_GROUPS: list = []
# Process groups for the ranks' own control messages (step timings), apart from the gradients'.
_CONTROL_GROUPS: list = []


def new_control_group():
    """A gloo group for small control collectives (the ranks' step timings), so that they never
    queue with the gradients' collectives; `WireCounter` counts its bytes as `control_bytes`,
    not as gradient traffic over the emulated link. Every rank must call it, in the same order."""
    group = dist.new_group(backend="gloo")
    _CONTROL_GROUPS.append(group)
    return group


def add_intra_node_group(group) -> None:
    """Mark `group` as node-local: `WireCounter` counts its bytes as `intra_node_bytes`."""
    _INTRA_NODE_GROUPS.append(group)


def allgather_bytes(nbytes: int, world: int) -> float:
    """Bytes one rank sends in an all-gather of its `nbytes` contribution: (n-1) x B."""
    return (world - 1) * nbytes if world > 1 else 0.0


def sharded_names(module=dist) -> tuple[str, str]:
    """The names FSDP2 calls its all-gather and reduce-scatter by in this torch: 2.13's
    `all_gather_single` and `reduce_scatter_single` where `module` has both, else the older
    `all_gather_into_tensor` and `reduce_scatter_tensor` (torch 2.11 and 2.12), which take the
    same arguments. Read at each `WireCounter.install`, not at import."""
    if hasattr(module, "all_gather_single") and hasattr(module, "reduce_scatter_single"):
        return "all_gather_single", "reduce_scatter_single"
    return "all_gather_into_tensor", "reduce_scatter_tensor"


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _group_arg(args: tuple, kwargs: dict, position: int):
    """The `group` argument of a collective, given by keyword or at `position`."""
    if "group" in kwargs:
        return kwargs["group"]
    return args[position] if len(args) > position else None


@dataclass
class WireCounter:
    """Bytes this rank sent and collectives it issued; `take()` returns and resets the window.

    What it patches: `install` replaces, in the `torch.distributed` module itself,
    `all_reduce`, `all_gather`, `all_gather_into_tensor` and FSDP2's all-gather and
    reduce-scatter (`sharded_names`: `all_gather_single` and `reduce_scatter_single` in torch
    2.13, `all_gather_into_tensor` and `reduce_scatter_tensor` before) with wrappers that charge
    the bytes a ring sends from this rank, then call the real function (and, with an emulated
    `link` attached, delay its work by the link's time). Process-wide: every caller that looks
    the function up on the module (DDP's comm hooks, torch's model averagers, FSDP2,
    `OuterStep`, the ranks' control messages) goes through it; a reference taken before
    `install` (`from torch.distributed import all_reduce`) does not.

    Why: torch has no byte counter per collective and no callback around one that a running
    job can read step by step (its profiler traces, after the fact), and the run's figures
    (`comm_bytes_total`, the trials' bytes per step) and the emulated link both need each
    collective where it is issued, with its size and group.

    How it restores: `install` keeps each replaced function, the real one, in `_restore`, and
    `uninstall` sets them back on the module and forgets them. The worker installs it once
    for the life of the job, after the process group exists, and uninstalls it in a `finally`
    (`training.worker.run`). A second install (this counter's or another's) without an
    uninstall between would wrap the first's wrappers and count each collective twice.

    The window and `total_bytes` hold the gradients' traffic over the network link; collectives
    inside a node-local group (hierarchical averaging) go to `intra_node_bytes` only, and those
    of a control group (`new_control_group`) to `control_bytes` only.
    """

    world: int
    bytes_sent: float = 0.0
    collectives: int = 0
    total_bytes: float = 0.0
    intra_node_bytes: float = 0.0
    control_bytes: float = 0.0
    link: Link | None = None  # an emulated link the network's collectives are delayed on
    _restore: tuple = field(default=(), repr=False)  # (name, the real collective) pairs

    def install(self) -> None:
        """Wrap the collectives in `torch.distributed` (`uninstall` puts them back). Each is
        wrapped once: where `all_gather_into_tensor` is FSDP2's all-gather (torch before
        2.13, `sharded_names`), it is counted as a sharded one, not also as a plain one."""
        gather, scatter = sharded_names()
        real_all_reduce, real_all_gather = dist.all_reduce, dist.all_gather

        def all_reduce(tensor, *args, **kwargs):
            group = _group_arg(args, kwargs, 1)  # all_reduce(tensor, op, group, async_op)
            sent = self._charge(ring_allreduce_bytes(_nbytes(tensor), self._size(group)), group)
            return self._carry(real_all_reduce(tensor, *args, **kwargs), sent)

        def all_gather(tensor_list, tensor, *args, **kwargs):
            group = _group_arg(args, kwargs, 0)  # all_gather(tensor_list, tensor, group, async_op)
            sent = self._charge(allgather_bytes(_nbytes(tensor), self._size(group)), group)
            return self._carry(real_all_gather(tensor_list, tensor, *args, **kwargs), sent)

        wrappers = {"all_reduce": all_reduce, "all_gather": all_gather}
        if gather != "all_gather_into_tensor":
            wrappers["all_gather_into_tensor"] = self._plain_gather(dist.all_gather_into_tensor)
        wrappers[gather], wrappers[scatter] = self._sharded_pair(
            getattr(dist, gather), getattr(dist, scatter)
        )
        self._restore = tuple((name, getattr(dist, name)) for name in wrappers)
        for name, wrapper in wrappers.items():
            setattr(dist, name, wrapper)

    def _plain_gather(self, real):
        """`all_gather_into_tensor` where it is not FSDP2's: counted as an all-gather, its
        work delayed by the emulated link like `all_gather`'s."""

        def all_gather_into_tensor(output_tensor, input_tensor, *args, **kwargs):
            group = _group_arg(args, kwargs, 0)
            sent = self._charge(allgather_bytes(_nbytes(input_tensor), self._size(group)), group)
            return self._carry(real(output_tensor, input_tensor, *args, **kwargs), sent)

        return all_gather_into_tensor

    def _sharded_pair(self, real_gather, real_scatter) -> tuple:
        """FSDP2's collectives (`sharded_names`): counted as a ring's (an all-gather sends
        (n-1) x its shard, a reduce-scatter (n-1)/n x its input), and, over an emulated link,
        blocking where issued for the link's time: FSDP waits only on a `Work` it recognises
        by type, which a delayed one is not (`_DelayedWork`)."""

        def all_gather(output_tensor, input_tensor, group=None, async_op=False):
            sent = self._charge(allgather_bytes(_nbytes(input_tensor), self._size(group)), group)
            work = real_gather(output_tensor, input_tensor, group=group, async_op=async_op)
            return self._block(work, sent)

        def reduce_scatter(output, input, op=dist.ReduceOp.SUM, group=None, **kw):
            n = self._size(group)
            sent = self._charge(_nbytes(input) * (n - 1) / n, group)
            work = real_scatter(output=output, input=input, op=op, group=group, **kw)
            return self._block(work, sent)

        return all_gather, reduce_scatter

    def uninstall(self) -> None:
        for name, real in self._restore:
            setattr(dist, name, real)
        self._restore = ()

    def _size(self, group) -> int:
        return dist.get_world_size(group) if group is not None else self.world

    def _charge(self, nbytes: float, group=None) -> float | None:
        """Count a collective's bytes where they belong; the bytes it puts on the network link
        (None: it stays off the link)."""
        if group is not None and self._size(group) == 1:
            return None  # a group of one rank (the profile's compute probe) uses no link
        if group is not None and any(group is g for g in _INTRA_NODE_GROUPS):
            self.intra_node_bytes += nbytes
            return None
        if group is not None and any(group is g for g in _CONTROL_GROUPS):
            self.control_bytes += nbytes
            return None
        self.bytes_sent += nbytes
        self.total_bytes += nbytes
        self.collectives += 1
        return nbytes

    def _carry(self, work, sent: float | None):
        """The collective's work, delayed by the emulated link where one is attached and the
        collective used it: a blocking call (no work) waits here, an asynchronous one's
        future completes later (`Link.deliver`)."""
        link = self.link
        if sent is None or link is None or not link.emulated:
            return work
        if work is None:
            rest = link.occupy(sent, 1) - now()
            if rest > 0:
                time.sleep(rest)
            return None
        return _DelayedWork(work, link.deliver(work.get_future(), sent, 1))

    def _block(self, work, sent: float | None):
        """The collective's `work`, done, after the emulated link's time for `sent` bytes
        (where one is attached and the collective used it)."""
        link = self.link
        if sent is None or link is None or not link.emulated:
            return work
        if work is not None:
            work.wait()
        rest = link.occupy(sent, 1) - now()
        if rest > 0:
            time.sleep(rest)
        return work

    def take(self) -> tuple[float, int]:
        out = (self.bytes_sent, self.collectives)
        self.bytes_sent, self.collectives = 0.0, 0
        return out

    @contextmanager
    def apart(self):
        """Count as usual inside (`take` works), then put every count back as it was on
        entry: traffic that is not the run's (compression trials) leaves no trace."""
        names = ("bytes_sent", "collectives", "total_bytes", "intra_node_bytes", "control_bytes")
        saved = [getattr(self, n) for n in names]
        try:
            yield self
        finally:
            for n, v in zip(names, saved, strict=True):
                setattr(self, n, v)


class _DelayedWork:
    """A collective's work whose completion waits for the emulated link: `get_future()` and
    `wait()` answer for the delayed future; anything else is the real work's."""

    def __init__(self, work, fut) -> None:
        self._work, self._fut = work, fut

    def get_future(self):
        return self._fut

    def wait(self, timeout=None) -> bool:
        self._fut.wait()
        return True

    def is_completed(self) -> bool:
        return self._fut.done()

    def __getattr__(self, name: str):
        return getattr(self._work, name)
