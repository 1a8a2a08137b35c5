"""Gradient communication: torch's DDP comm hooks by name, wire-byte accounting, emulated links.

Bytes are counted where every collective passes: torch's hooks (`default_hooks`,
`powerSGD_hook`) and model averagers all call `torch.distributed.all_reduce`, so `WireCounter`
wraps that function (and `all_gather`) for the life of a worker and charges each call what the
algorithm puts on the wire from this rank: a ring all-reduce of B bytes over n ranks sends
2(n-1)/n x B, an all-gather of a B-byte contribution sends (n-1) x B. torch offers no
per-collective callback, hence the wrapper.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from hetflow.config import parse_compression


def ring_allreduce_bytes(nbytes: int, world: int) -> float:
    return 2 * (world - 1) / world * nbytes if world > 1 else 0.0


def allgather_bytes(nbytes: int, world: int) -> float:
    return (world - 1) * nbytes if world > 1 else 0.0


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass
class WireCounter:
    """Bytes this rank sent and collectives it issued; `take()` returns and resets the window."""

    world: int
    bytes_sent: float = 0.0
    collectives: int = 0
    total_bytes: float = 0.0

    def install(self) -> None:
        real_all_reduce, real_all_gather = dist.all_reduce, dist.all_gather

        def all_reduce(tensor, *args, **kwargs):
            self._charge(ring_allreduce_bytes(_nbytes(tensor), self._size(kwargs)))
            return real_all_reduce(tensor, *args, **kwargs)

        def all_gather(tensor_list, tensor, *args, **kwargs):
            self._charge(allgather_bytes(_nbytes(tensor), self._size(kwargs)))
            return real_all_gather(tensor_list, tensor, *args, **kwargs)

        dist.all_reduce, dist.all_gather = all_reduce, all_gather
        self._restore = (real_all_reduce, real_all_gather)

    def uninstall(self) -> None:
        dist.all_reduce, dist.all_gather = self._restore

    def _size(self, kwargs) -> int:
        group = kwargs.get("group")
        return dist.get_world_size(group) if group is not None else self.world

    def _charge(self, nbytes: float) -> None:
        self.bytes_sent += nbytes
        self.total_bytes += nbytes
        self.collectives += 1

    def take(self) -> tuple[float, int]:
        out = (self.bytes_sent, self.collectives)
        self.bytes_sent, self.collectives = 0.0, 0
        return out


@dataclass
class Link:
    """An emulated network link: each window of traffic costs bytes / bandwidth + latency."""

    gbps: float | None
    latency_s: float = 0.0

    def delay(self, nbytes: float, collectives: int) -> float:
        if self.gbps is None and not self.latency_s:
            return 0.0
        seconds = collectives * self.latency_s
        if self.gbps:
            seconds += nbytes * 8 / (self.gbps * 1e9)
        if seconds > 0:
            time.sleep(seconds)
        return seconds


def register_compression(ddp: torch.nn.parallel.DistributedDataParallel, method: str, hook_wrapper):
    """Attach the comm hook for `method` (never 'auto'), wrapped by `hook_wrapper(hook)`."""
    name, arg = parse_compression(method)
    if name == "none":
        state, hook = None, default_hooks.allreduce_hook
    elif name == "fp16":
        state, hook = None, default_hooks.fp16_compress_hook
    elif name == "bf16":
        state, hook = None, default_hooks.bf16_compress_hook
    elif name == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=int(arg), start_powerSGD_iter=10,
            min_compression_rate=1, use_error_feedback=True, warm_start=True, random_seed=0,
        )
        hook = powerSGD_hook.powerSGD_hook
    else:
        raise NotImplementedError(f"train.compression: {method!r} is not implemented yet")
    ddp.register_comm_hook(state, hook_wrapper(hook))
    return state


def wrap_optimizer(optimizer: torch.optim.Optimizer, method: str, state) -> torch.optim.Optimizer:
    """The optimizer the method needs (local SGD averages models in the optimizer's step)."""
    return optimizer


def choose_compression(comm_share: float, threshold: float = 0.25) -> tuple[str, str]:
    """'auto': compress only when communication is a large share of the step; say why."""
    if comm_share < threshold:
        return "none", (
            f"measured communication is {comm_share:.0%} of the step (< {threshold:.0%}): "
            "compression would cost accuracy for little time"
        )
    if comm_share < 0.5:
        return "fp16", f"communication is {comm_share:.0%} of the step: fp16 halves the bytes"
    return "powersgd:4", (
        f"communication is {comm_share:.0%} of the step: PowerSGD rank 4 cuts bytes by >8x"
    )
