"""Probes that measure a worker as training will run it (inside the cluster, under torchrun).

An emulated worker is measured through its emulation, never read from its settings: compute is
dilated by its `Emulator` as in a training step, each collective pays its own `Link` delay
through the `WireCounter`, S3 reads pay the cache's emulated store. With emulation off the same
code measures a real instance.

Every rank runs every probe; `profile` returns this rank's `RankProfile`, which the worker
gathers on rank 0. One module per probe, each naming its figures: `compute`, `memory`,
`device`, `network` (the all-reduce and the link), `s3`; `probe_s` is each probe's duration.
How each figure is taken: docs/concepts.md ("Profile").
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch.distributed as dist

from hetflow.emulation.emulator import now
from hetflow.records import RankProfile
from hetflow.training.launch.spec import default_profile_batches, node_id
from hetflow.training.probes.compute import (
    COMPUTE_BUDGET_S,
    probe_compute,
    solo_ddp,
    solo_sharded,
)
from hetflow.training.probes.device import probe_matmul, probe_memory_bandwidth
from hetflow.training.probes.memory import probe_memory
from hetflow.training.probes.network import probe_allreduce, probe_link
from hetflow.training.probes.s3 import probe_s3
from hetflow.training.rank import RankContext
from hetflow.training.recipes import DataInfo, parameter_count, recipe_of, seeded_model

__all__ = ["profile"]


def profile(ctx: RankContext) -> RankProfile:
    """Measure this rank as training will run it: compute, memory, all-reduce, link, S3 reads.

    Collective: every rank of the job calls it (the barriers, the all-reduce and the link ring).
    Returns this rank's figures with `rank` and `node` filled; `worker` and `relative_speed`
    are the flow's to set, once every rank is known.
    """
    spec, data, rank, world = ctx.spec, ctx.data, ctx.rank, ctx.world
    amp, counter = ctx.amp, ctx.counter
    device = amp.device  # the rank's, in the precision it trains in
    emu = ctx.clocks("profile")  # the worker's emulator, a table of its own for the probes
    recipe = ctx.recipe or recipe_of(spec.train)  # the worker's, made once
    info = DataInfo.from_manifest(data.manifest)
    model = seeded_model(recipe, info, spec.train.seed).to(device)
    sizes = spec.profile_batches or default_profile_batches(spec.train.global_batch, world)
    head = data.head("train", max([*sizes, 64]))  # the probes' samples only
    x, y = head.x, head.y
    took: dict[str, float] = {}

    def timed(name: str, fn: Callable, *args):
        t = now()
        out = fn(*args)
        took[name] = now() - t
        return out

    if spec.train.strategy == "fsdp":  # a copy: the memory probe below takes the plain model
        probed = copy.deepcopy(model)
        net = solo_sharded(probed, recipe.shard_units(probed))
    else:
        net = solo_ddp(model, emu)
    dist.barrier()  # start together: every rank's compute probe sees the same host load
    ref = max(1, spec.train.global_batch // world)
    comp = timed(
        "compute", probe_compute, net, x, y, emu, sizes, ref, COMPUTE_BUDGET_S, recipe, amp
    )
    optimizer = spec.train.optimizer  # resolved before launch (`run_workers`)
    mem = timed("memory", probe_memory, model, x, y, optimizer, recipe)
    mm = timed("matmul", probe_matmul, emu, device)
    bw = timed("memory_bandwidth", probe_memory_bandwidth, emu, device)
    s3 = timed("s3", probe_s3, data)  # fast workers read while the slowest still computes
    grad_bytes = parameter_count(model) * 4
    dist.barrier()
    wire = device if spec.backend == "nccl" else "cpu"  # where the default group's tensors live
    ar = timed("allreduce", probe_allreduce, world, counter, emu, grad_bytes, wire)
    link = timed("link", probe_link, rank, world, emu, wire)
    return RankProfile(
        rank=rank,
        node=node_id(),
        **comp,
        **mem,
        matmul_gflops=mm,
        memory_gbps=bw,
        **ar,
        **link,
        grad_bytes=grad_bytes,
        device=str(device).split(":")[0],
        **s3,
        probe_s=took,
    )
