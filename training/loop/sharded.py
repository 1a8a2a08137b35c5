"""Sharded data parallelism (`train.strategy: fsdp`): the recipe's model under torch's FSDP2
`fully_shard`, its shards checkpointed and its full state gathered for rank 0, and the bytes
of training state a rank holds. torch's own APIs throughout (`fully_shard`,
`torch.distributed.checkpoint` and its `state_dict` helpers); no collective of hetflow's own.

What differs from DDP (`training.loop.net.build_net`; the strategy's `Net` is
`training.loop.fsdp.ShardedNet`):

- Each rank holds 1/world of every parameter, its gradient and its optimizer state (a DTensor
  shard). Forward all-gathers each unit's parameters (`Recipe.shard_units`, then the root), and
  backward reduce-scatters its gradient, so EVERY rank joins every step's collectives: a rank
  the plan gives no samples steps on an empty batch (`ComputingRanks` keeps every rank: there
  is no comm hook to move to a smaller group).
- The gradient's weighting is `MeanOverCounts`' as under DDP: FSDP divides the reduce-scattered
  sum by the world size, as DDP's all-reduce averages (`set_gradient_divide_factor(1.0)` would
  need PREMUL_SUM, which gloo lacks).
- No comm hook: the plain gradient only (`check_job` refuses compression). The emulator's
  compute phase ends where the optimizer's step begins (`end_phase_at_step`), after backward
  and its reduce-scatters; DDP's hook ends it at the last bucket, before the last collectives.
  A barrier after the step then holds a rank's wait for a slower one (DDP's last all-reduce
  holds it there).
- Checkpoints: every rank writes its own shards with `torch.distributed.checkpoint`
  (`save_shards`), and a run on another number of ranks reads them back re-sharded to its
  own placements (`load_shards`). Rank 0 evaluates and exports a full copy gathered from
  every rank's shards (`full_state`, a collective every rank calls).
- Precision: the autocast of `MixedPrecision` as under DDP; fp16's loss scale is refused
  (`check_job`): its Inf/NaN check would see each rank's shard only, so ranks could disagree.
- Micro-batches (`train.accumulate: auto`), with counts that differ between ranks: in a step
  where any rank's share splits (the plan is the same on every rank), every rank keeps each
  unit gathered from its first forward to its last backward (`gathered`), and skips the
  reduce-scatter on all its micro-batches but the last (`no_sync`): one all-gather and one
  reduce-scatter per unit and step on every rank, whatever its count (FSDP2's `unshard` is a
  no-op on a gathered unit). The cost, in those steps only: the whole parameters and their
  whole gradients are held for the step (ZeRO-2-like); the optimizer state stays sharded.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

# torch.distributed.checkpoint, .fsdp and .tensor are imported where used: together they take
# a second of a rank's start (sympy under DTensor's shape rules), which a DDP run never needs.


def _gather_options():
    """Full (unsharded) state dicts, gathered onto rank 0's CPU."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def shard_model(model: nn.Module, units: list[nn.Module]) -> nn.Module:
    """`model` sharded in place: each of `units` that has parameters, then the root (which
    takes the parameters no unit holds). Returns `model` (its class now an FSDP module)."""
    from torch.distributed.fsdp import fully_shard

    for unit in units:
        if any(True for _ in unit.parameters()):
            fully_shard(unit)
    fully_shard(model)
    return model


@contextmanager
def gathered(model: nn.Module) -> Iterator[None]:
    """A step in which `model`'s units (every FSDP module but the root, which FSDP already keeps
    gathered after forward) stay gathered after forward: the first forward all-gathers each
    unit, later forwards and backwards find it gathered (`unshard` is then a no-op), and the
    backward that reduce-scatters (not under `no_sync`) reshards it. Every rank enters it in
    the same steps (`Net.step_context`), so that each makes one all-gather per unit whatever
    its count of micro-batches; outside, units reshard after forward as FSDP's default. The
    whole parameters stay in memory from the first forward to the last backward."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule) and m is not model]
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for unit in units:
            unit.set_reshard_after_forward(True, recurse=False)


@contextmanager
def no_sync(model: nn.Module) -> Iterator[None]:
    """FSDP2's counterpart of DDP's `no_sync`, for a micro-batch's backward but the last:
    gradients accumulate whole (unsharded) in place, no reduce-scatter, and the units stay
    gathered (`set_requires_gradient_sync`, `set_reshard_after_backward`, both recursive).
    The last backward, outside, reduce-scatters the sum and reshards."""
    model.set_requires_gradient_sync(False)
    model.set_reshard_after_backward(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
        model.set_reshard_after_backward(True)


def end_phase_at_step(opt: torch.optim.Optimizer, emu) -> None:
    """The emulated compute phase (`Emulator.start` in the step) ends when `opt` steps: the
    end of backward where no DDP comm hook ends it. After the step every rank meets the
    others (a barrier): a rank whose phase ended sooner waits there, in its step's wait, as
    under DDP in the last all-reduce, not in the next step's first all-gather, which would
    count the wait as its compute and mislead the re-balancer."""

    def finish(*_) -> None:
        emu.finish()

    def meet(*_) -> None:
        dist.barrier()

    opt.register_step_pre_hook(finish)
    opt.register_step_post_hook(meet)


def inner(opt):
    """The torch optimizer under wrappers that keep it as `.opt` (`FiniteGuard`)."""
    while not isinstance(opt, torch.optim.Optimizer) and hasattr(opt, "opt"):
        opt = opt.opt
    return opt


def full_state(model: nn.Module, opt) -> tuple[dict, dict]:
    """(the model's, the optimizer's) full state dicts on rank 0's CPU, keyed by parameter
    name; empty on the other ranks. A collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    gather = _gather_options()
    model_state = get_model_state_dict(model, options=gather)
    return model_state, get_optimizer_state_dict(model, inner(opt), options=gather)


def _storage(where: str, write: bool):
    """DCP's storage for `where`: a local path (FileSystemWriter/Reader) or any fsspec URL,
    s3:// included (FsspecWriter/Reader). Those two live in torch's private
    `_fsspec_filesystem` module (torch 2.13 exports no public fsspec storage); s3fs reads the
    endpoint and credentials from the AWS_* variables, as `hetflow.infra.s3` does."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

    if "://" not in where or where.startswith("file://"):
        path = where.removeprefix("file://")
        return dcp.FileSystemWriter(path) if write else dcp.FileSystemReader(path)
    return FsspecWriter(where) if write else FsspecReader(where)


def save_shards(model: nn.Module, opt, where: str) -> None:
    """Every rank writes its shards of the model and optimizer state (keyed by parameter
    name) into the folder `where` (`_storage`); rank 0, DCP's coordinator, writes the
    folder's metadata. A collective: when it returns on any rank, every rank's files and the
    metadata are written (dcp.save ends in an all-reduce over every rank's write results)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, opt_state = get_state_dict(model, inner(opt))
    dcp.save({"model": model_state, "optim": opt_state}, storage_writer=_storage(where, True))


def load_shards(model: nn.Module, opt, where: str) -> None:
    """`save_shards`' folder `where` loaded into this rank's shards, whatever the number of
    ranks that wrote it: DCP reads each rank's part of every tensor for the placements of
    this run's DTensors (re-sharding). A collective."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, opt_state = get_state_dict(model, inner(opt))
    state = {"model": model_state, "optim": opt_state}
    dcp.load(state, storage_reader=_storage(where, False))
    set_state_dict(
        model, inner(opt), model_state_dict=state["model"], optim_state_dict=state["optim"]
    )


def local_bytes(t: torch.Tensor) -> int:
    """The bytes of `t` this rank holds: its local shard for a DTensor (none exists where
    torch.distributed.tensor was never imported)."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    t = t.to_local() if dtensor is not None and isinstance(t, dtensor.DTensor) else t
    return t.numel() * t.element_size()


def state_bytes(model: nn.Module, opt) -> int:
    """The bytes of training state this rank holds: its parameters, as many again for their
    gradients (held from backward to `zero_grad`; DDP keeps them in its buckets), and the
    optimizer's state tensors. Under fsdp, local shards only."""
    params = sum(local_bytes(p) for p in model.parameters())
    state = inner(opt).state.values()
    optim = sum(local_bytes(v) for s in state for v in s.values() if torch.is_tensor(v))
    return 2 * params + optim
