"""Probes that measure a worker as training will run it (inside the cluster, under torchrun).

Probes of an emulated worker measure the emulation, never read its settings: compute phases are
dilated by the worker's `Emulator` exactly as in a training step, each collective pays this
worker's own `Link` delay through the `WireCounter`, and S3 reads pay the cache's emulated
object store when there is one. The same code measures a real instance when emulation is off.

What each figure is and how it is taken (every rank runs every probe; `profile` returns this
rank's `RankProfile`, which the worker gathers on rank 0):

- **compute** (`compute.py`: `samples_per_s`, `fit_latency_s`, `fit_s_per_sample`,
  `step_compute_s`): forward+backward of the job's model through DDP at `spec.profile_batches`,
  in interleaved rounds (every batch size once per round, the order alternating) for a fixed
  wall-time budget that starts on all ranks at once, so that every rank samples the same
  stretch of the host's load (at least `COMPUTE_MIN_ROUNDS` rounds; a slow worker does fewer
  rounds than a fast one). Each step follows a pause of at least `COMPUTE_PAUSE_S` since the
  previous one computed, as in training. Per batch size the best time (interference only adds
  time); `time = a + b x batch` fitted by least squares to those, leaving out the one batch size
  that lies more than 30% off the line through the others (`fitting.robust_affine`: a burst of
  load on a shared host). `samples_per_s` is the throughput at the reference batch
  `global_batch / world`.
- **memory** (`memory.py`: `memory_per_sample_bytes`, `memory_fixed_bytes`,
  `memory_cap_batch`): the bytes autograd saves for backward (`saved_tensors_hooks`, storages
  counted once, parameters left out) at two batch sizes give the bytes per sample; the fixed
  part is parameters + gradients + optimizer state. The cap is the largest batch whose
  activations fit in `MEMORY_HEADROOM` of the memory available to this rank: free device memory
  on CUDA, else the host's `MemAvailable` shared by the ranks of the host (`LOCAL_WORLD_SIZE`).
- **device** (`device.py`: `matmul_gflops` of a 256 x 256 fp32 matmul, `memory_gbps` of a copy
  of 8 MiB): best of 2, dilated like a compute phase.
- **all-reduce** (`network.py`: `allreduce_latency_s`, `allreduce_gbps`, `grad_allreduce_s`):
  messages of `ALLREDUCE_SIZES` and the gradient's size. Each is timed on every rank from the
  barrier before it to the end of this rank's own link delay, so a worker's slow link shows in
  its own figure (rank by rank). Per size the median, fitted to `latency + wire bytes /
  bandwidth` (`fitting.fit_transfer`: least-squares slope, latency from the smallest message);
  wire bytes are the ring's 2(n-1)/n x B, so the bandwidth is the all-reduce "bus bandwidth" of
  nccl-tests. `grad_allreduce_s` is the fit at the gradient size.
- **link** (`network.py`: `link_gbps`, `link_latency_s`): this worker's own link, from a ring
  of point-to-point sends (`LINK_SIZES`), each timed on its sender from the receiver's "ready"
  to the end of the send and the sender's link delay; the best of `LINK_REPS` per size, fitted
  like the all-reduce. It is measured in series with the real transport (loopback here), so an
  emulated link reads slightly slower than its setting: 1/measured = 1/link + 1/transport.
- **S3** (`s3.py`: `s3_first_byte_s`, `s3_read_mbps`): 1-byte range reads of two shards
  (median), then whole shards, largest first, for up to `S3_BUDGET_S`, through fsspec at the
  dataset URL.

`probe_s` records how long each probe took on this rank.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.distributed as dist

from hetflow.emulation.emulator import now
from hetflow.records import RankProfile
from hetflow.training.devices import synchronizer
from hetflow.training.launch.spec import default_profile_batches, emulator_for, node_id
from hetflow.training.loop.optim import resolve_optimizer
from hetflow.training.probes.compute import COMPUTE_BUDGET_S, probe_compute, solo_ddp
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
    emu = emulator_for(spec, rank, synchronizer(device), scope="profile")
    recipe = recipe_of(spec.train)
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

    net = solo_ddp(model, emu)
    dist.barrier()  # start together: every rank's compute probe sees the same host load
    ref = max(1, spec.train.global_batch // world)
    comp = timed(
        "compute", probe_compute, net, x, y, emu, sizes, ref, COMPUTE_BUDGET_S, recipe, amp
    )
    optimizer = resolve_optimizer(spec.train, recipe).optimizer
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
        **s3,
        probe_s=took,
    )
