"""Probes that measure a worker as training will run it (inside the cluster, under torchrun).

Probes of an emulated worker measure the emulation, never read its settings: compute phases are
dilated by the worker's `Emulator` exactly as in a training step, each collective pays this
worker's own `Link` delay through the `WireCounter`, and S3 reads pay the cache's emulated
object store when there is one. The same code measures a real instance when emulation is off.

What each figure is and how it is taken (every rank runs every probe; rank 0 gathers them):

- **compute** (`samples_per_s`, `fit_latency_s`, `fit_s_per_sample`, `step_compute_s`):
  forward+backward of the job's model at `spec.profile_batches`, in interleaved rounds (every
  batch size once per round, the order alternating) for a fixed wall-time budget that starts on
  all ranks at once, so that every rank samples the same stretch of the host's load (at least 3
  rounds; a slow worker does fewer rounds than a fast one). Each step follows a pause of at
  least `COMPUTE_PAUSE_S` since the previous one computed, as in training. Per batch size the
  best time (interference only adds time); `time = a + b x batch` fitted by least squares to
  those, leaving out the one batch size that lies more than 30% off the line through the others
  (a burst of load on a shared host).
  `samples_per_s` is the throughput at the reference batch `global_batch / world`.
- **memory** (`memory_per_sample_bytes`, `memory_fixed_bytes`, `memory_cap_batch`): the bytes
  autograd saves for backward (`torch.autograd.graph.saved_tensors_hooks`, storages counted
  once, parameters left out) at two batch sizes give the bytes per sample; the fixed part is
  parameters + gradients + optimizer state. The cap is the largest batch whose activations fit
  in 80% of the memory available to this rank: free device memory on CUDA, else the host's
  `MemAvailable` shared by the ranks of the host (`LOCAL_WORLD_SIZE`).
- **matmul GFLOP/s** (256 x 256 fp32) and **memory bandwidth** (copy of 8 MiB): best of 2,
  dilated like a compute phase.
- **all-reduce** (`allreduce_latency_s`, `allreduce_gbps`, `grad_allreduce_s`): messages of
  4 KiB to 2 MiB and the gradient's size. Each is timed on every rank from the barrier before
  it to the end of this rank's own link delay, so a worker's slow link shows in its own figure
  (rank by rank). Per size the median, fitted to `latency + wire bytes / bandwidth`
  (`fit_transfer`: least-squares slope, latency from the smallest message); wire bytes are the
  ring's 2(n-1)/n x B, so the bandwidth is the all-reduce "bus bandwidth" of nccl-tests.
  `grad_allreduce_s` is the fit at the gradient size.
- **link** (`link_gbps`, `link_latency_s`): this worker's own link, from a ring of
  point-to-point sends (64 KiB to 2 MiB), each timed on its sender from the receiver's "ready"
  to the end of the send and the sender's link delay; the best of 4 per size, fitted like the
  all-reduce. It is measured in series with the real transport (loopback here), so an
  emulated link reads slightly slower than its setting: 1/measured = 1/link + 1/transport.
- **S3** (`s3_first_byte_s`, `s3_read_mbps`): 1-byte range reads of two shards (median), then
  whole shards, largest first, for up to 0.1 s, through fsspec at the dataset URL.

`probe_s` records how long each probe took on this rank.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from hetflow.emulation.emulator import SMOOTH_PHASES, Emulator, now
from hetflow.infra.s3 import filesystem
from hetflow.training.comm import WireCounter
from hetflow.training.data import RankData
from hetflow.training.job import RunSpec, emulator_for
from hetflow.training.models import build_model, parameter_count

COMPUTE_BUDGET_S = 2.0  # wall time of the compute probe (every rank alike)
# An emulated worker's step at a batch size is dilated from the least CPU time of its last
# SMOOTH_PHASES steps at that size: as many rounds as that, and the probe's best round is the
# same statistic as a settled training step (the least of 7, not of 3). Training still ran 1-16%
# faster per step than the profile in `hetflow bench hetero` (`compute_model_error`); the
# cause is not found.
COMPUTE_MIN_ROUNDS = SMOOTH_PHASES
COMPUTE_MAX_ROUNDS = 15
# Every timed step starts at least this long after the previous one finished computing (an
# emulated worker's dilation pause counts). In training a worker computes after the all-reduce
# and the wait for the others, and caches cool in that pause: on the 2-core test host a
# fwd+bwd takes ~20% more CPU time after 60 ms idle than back to back. Without the pause the
# fastest worker (short pauses) would look up to 15% faster than it trains.
COMPUTE_PAUSE_S = 0.08
ALLREDUCE_SIZES = (4_096, 65_536, 524_288, 2_097_152)
ALLREDUCE_REPS = 3  # timed, after one untimed warm-up per size
LINK_SIZES = (65_536, 524_288, 2_097_152)
LINK_REPS = 4
MEMORY_HEADROOM = 0.8
S3_BUDGET_S = 0.1


def profile(spec: RunSpec, data: RankData, rank: int, world: int, counter: WireCounter) -> dict:
    """Measure this rank as training will run it: compute, memory, all-reduce, S3 reads."""
    emu = emulator_for(spec, rank)
    model = build_model(spec.train.model, data.manifest.features, data.manifest.classes, spec.train.seed)
    x, y = torch.from_numpy(data.train.x), torch.from_numpy(data.train.y)
    took: dict[str, float] = {}

    def timed(name: str, fn: Callable, *args):
        t = now()
        out = fn(*args)
        took[name] = now() - t
        return out

    net = solo_ddp(model, emu)
    dist.barrier()  # start together: every rank's compute probe sees the same host load
    ref = max(1, spec.train.global_batch // world)
    comp = timed("compute", probe_compute, net, x, y, emu, list(spec.profile_batches), ref)
    mem = timed("memory", probe_memory, model, x, y, spec.train.optimizer)
    mm = timed("matmul", probe_matmul, emu)
    bw = timed("memory_bandwidth", probe_memory_bandwidth, emu)
    s3 = timed("s3", probe_s3, data)  # fast workers read while the slowest still computes
    grad_bytes = parameter_count(model) * 4
    dist.barrier()
    ar = timed("allreduce", probe_allreduce, world, counter, emu, grad_bytes)
    link = timed("link", probe_link, rank, world, emu)
    return {
        **comp,
        **mem,
        "matmul_gflops": mm,
        "memory_gbps": bw,
        **ar,
        **link,
        "grad_bytes": grad_bytes,
        **s3,
        "probe_s": took,
    }


# -- compute ---------------------------------------------------------------------------------


def fit_affine(xs: Sequence[float], ts: Sequence[float]) -> tuple[float, float]:
    """(intercept, slope) of t = a + b x by least squares; needs two distinct x."""
    x = np.asarray(xs, dtype=float)
    t = np.asarray(ts, dtype=float)
    if len(set(x.tolist())) < 2:
        raise ValueError("fit_affine: need at least two distinct x values")
    (a, b), *_ = np.linalg.lstsq(np.stack([np.ones_like(x), x], axis=1), t, rcond=None)
    return float(a), float(b)


def solo_ddp(model: nn.Module, emu: Emulator) -> DDP:
    """`model` wrapped as training wraps it (DDP, the compute phase ended by the comm hook at the
    last bucket), reducing over a group of this rank alone, so that each rank may step on its own.

    DDP's own work in a step (forward bookkeeping, the reducer's hooks in backward) is part of
    a worker's compute and is dilated with it, so a probe of the bare model under-estimates a
    slow worker's step. `hetflow bench hetero` reports the gap per rank
    (`compute_model_error`: measured over planned compute at the first plan's batches).
    """
    solo, _ = dist.new_subgroups(group_size=1)  # every rank creates every group, in order
    net = DDP(model, process_group=solo, gradient_as_bucket_view=True)  # as training.worker
    net.register_comm_hook(solo, emu.dilating_hook(default_hooks.allreduce_hook))
    return net


def _step(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> None:
    nn.functional.cross_entropy(model(xb), yb).backward()
    model.zero_grad(set_to_none=True)


def fit_transfer(nbytes: Sequence[float], ts: Sequence[float]) -> tuple[float, float]:
    """(latency s, s per byte) of t = latency + bytes / bandwidth from one time per size.

    The slope is the least-squares fit (the largest messages weigh most, as they should for a
    bandwidth); the latency is what the smallest message took beyond its bytes, so that a
    sleep's wake-up jitter on a busy host shows as latency and does not bend the bandwidth.
    """
    _, slope = fit_affine(nbytes, ts)
    if slope <= 0:  # latency hides the bytes (loopback): report the bandwidth's lower bound,
        largest = max(range(len(nbytes)), key=lambda i: nbytes[i])  # all of it transfer
        slope = max(ts[largest], 1e-12) / max(nbytes[largest], 1)
    small = min(range(len(nbytes)), key=lambda i: nbytes[i])
    return max(ts[small] - slope * nbytes[small], 0.0), slope


def robust_affine(xs: Sequence[float], ts: Sequence[float], outlier: float = 0.3
                  ) -> tuple[float, float, float | None]:
    """(a, b, dropped x) of t = a + b x; with 4+ points, one point may be left out.

    The candidate is the point without which the others lie best on a line; it is left out
    when it lies more than `outlier` (relative) off that line: a burst of load on the shared
    host that spoiled most samples of one batch size must not bend the fit.
    """
    a, b = fit_affine(xs, ts)
    if len(xs) < 4:
        return a, b, None
    best = None
    for i in range(len(xs)):
        rest = [j for j in range(len(xs)) if j != i]
        ai, bi = fit_affine([xs[j] for j in rest], [ts[j] for j in rest])
        spread = max(abs(ts[j] / (ai + bi * xs[j]) - 1) if ai + bi * xs[j] > 0 else math.inf
                     for j in rest)
        if best is None or spread < best[0]:
            best = (spread, i, ai, bi)
    _, i, ai, bi = best
    predicted = ai + bi * xs[i]
    if predicted > 0 and abs(ts[i] / predicted - 1) > outlier:
        return ai, bi, xs[i]
    return a, b, None


def probe_compute(model: nn.Module, x: torch.Tensor, y: torch.Tensor, emu: Emulator,
                  sizes: list[int], ref: int, budget_s: float = COMPUTE_BUDGET_S) -> dict:
    sizes = sorted({max(1, min(int(b), len(x))) for b in sizes})
    if len(sizes) < 2:
        sizes = sorted({1, max(2, len(x) // 2)})
    batches = {b: (x[:b], y[:b]) for b in sizes}
    for b in sizes:  # warm-up: allocations, kernel selection (not dilated, not timed)
        _step(model, *batches[b])

    computed = now()

    def timed_step(b: int) -> float:
        nonlocal computed
        rest = COMPUTE_PAUSE_S - (now() - computed)
        if rest > 0:  # cool down as long as a step of training does (see COMPUTE_PAUSE_S)
            time.sleep(rest)
        t = now()
        emu.start(key=b)
        _step(model, *batches[b])
        end = emu.finish()  # a no-op when the model's comm hook has ended the phase
        computed = emu.computed_at
        return end - t

    # One dilated step, untimed: every timed step then follows a pause, as in training
    # (a step straight after the warm-up finds warm caches and runs up to 30% faster).
    timed_step(sizes[0])
    times: dict[int, list[float]] = {b: [] for b in sizes}
    start = now()
    rounds = 0
    while rounds < COMPUTE_MAX_ROUNDS and (rounds < COMPUTE_MIN_ROUNDS or now() - start < budget_s):
        for b in sizes if rounds % 2 == 0 else sizes[::-1]:
            times[b].append(timed_step(b))
        rounds += 1
    # Interference on a shared host only ever adds time (a core taken, caches thrashed), so the
    # best of the rounds is the estimate nearest the worker's own speed; the median let one
    # burst of load spoil a slow worker's few rounds (22% off in one CI run; over 10 profiles
    # of speeds 1,2,3,4 here the worst error was 25% with the median, 10.6% with the best).
    best = [min(times[b]) for b in sizes]
    intercept, slope, dropped = robust_affine(sizes, best)
    if slope <= 0:  # a flat or noisy curve: fall back to the largest batch's throughput
        slope, intercept = best[-1] / sizes[-1], 0.0
    step_at_ref = max(intercept + slope * ref, 1e-9)
    return {
        "samples_per_s": ref / step_at_ref,
        "fit_latency_s": float(intercept),
        "fit_s_per_sample": float(slope),
        "step_compute_s": float(step_at_ref),
        "compute_rounds": rounds,
        "compute_batches": sizes,
        "compute_best_s": best,
        "compute_outlier_batch": dropped,
    }


# -- memory ----------------------------------------------------------------------------------


def saved_activation_bytes(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> int:
    """Bytes autograd keeps for backward in one forward pass (each storage once, no parameters)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in params:
            seen[ptr] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = nn.functional.cross_entropy(model(xb), yb)
    del loss
    return sum(seen.values()) + xb.numel() * xb.element_size()


def available_memory_bytes() -> int:
    """Memory this rank may use: free device memory on CUDA, else its share of MemAvailable."""
    if torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info()
        return int(free)
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if avail is None:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return int(avail) // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def probe_memory(model: nn.Module, x: torch.Tensor, y: torch.Tensor, optimizer: str) -> dict:
    small, large = max(1, min(8, len(x) // 2)), max(2, min(64, len(x)))
    if large <= small:
        small, large = 1, 2
    m_small = saved_activation_bytes(model, x[:small], y[:small])
    m_large = saved_activation_bytes(model, x[:large], y[:large])
    per_sample = max((m_large - m_small) / (large - small), 1.0)
    state_copies = {"sgd": 1, "adam": 2}.get(optimizer, 2)  # momentum / Adam moments
    fixed = parameter_count(model) * 4 * (2 + state_copies) + max(0.0, m_small - per_sample * small)
    avail = available_memory_bytes()
    cap = int((avail * MEMORY_HEADROOM - fixed) // per_sample)
    return {
        "memory_per_sample_bytes": float(per_sample),
        "memory_fixed_bytes": float(fixed),
        "memory_available_bytes": avail,
        "memory_cap_batch": max(cap, 0),
    }


# -- raw device figures ----------------------------------------------------------------------


def _best_dilated(emu: Emulator, fn: Callable[[], None], reps: int = 2) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(reps):
        t = now()
        emu.start()
        fn()
        emu.finish()
        best = min(best, now() - t)
    return best


def probe_matmul(emu: Emulator, n: int = 256) -> float:
    """GFLOP/s of an n x n fp32 matmul on this rank's threads (dilated like compute)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    seconds = _best_dilated(emu, lambda: torch.mm(a, b, out=out))
    return 2 * n**3 / seconds / 1e9


def probe_memory_bandwidth(emu: Emulator, nbytes: int = 8 * 2**20) -> float:
    """GB/s of a tensor copy (bytes read + bytes written), dilated like compute."""
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    seconds = _best_dilated(emu, lambda: dst.copy_(src))
    return 2 * nbytes / seconds / 1e9


# -- all-reduce ------------------------------------------------------------------------------


def probe_allreduce(world: int, counter: WireCounter, emu: Emulator, grad_bytes: int,
                    sizes: Sequence[int] = ALLREDUCE_SIZES, reps: int = ALLREDUCE_REPS) -> dict:
    wire = 2 * (world - 1) / world if world > 1 else 1.0
    all_sizes = sorted({int(s) for s in sizes} | {int(grad_bytes)})
    medians = []
    for nbytes in all_sizes:
        buf = torch.zeros(max(1, nbytes // 4))
        samples = []
        for rep in range(reps + 1):
            dist.barrier()
            t = now()
            dist.all_reduce(buf)
            sent, ncoll = counter.take()
            emu.link.delay(sent, ncoll)
            if rep:  # the first of each size is a warm-up
                samples.append(now() - t)
        medians.append(statistics.median(samples))
    latency, slope = fit_transfer([wire * s for s in all_sizes], medians)
    return {
        "allreduce_latency_s": float(latency),
        "allreduce_gbps": float(8 / slope / 1e9),
        "grad_allreduce_s": float(latency + slope * wire * grad_bytes),
        "allreduce_bytes": all_sizes,
        "allreduce_median_s": medians,
    }


def probe_link(rank: int, world: int, emu: Emulator, sizes: Sequence[int] = LINK_SIZES,
               reps: int = LINK_REPS) -> dict:
    """This worker's own link: it sends to the next rank while receiving from the previous one.

    Every rank sends at once (a ring of point-to-point transfers). The receiver posts its
    receive and then tells the sender it is ready; the sender starts its clock on that word, so
    that no rank times another's lateness. Timed on the sender to the end of its send plus its
    link's delay for the bytes it sent (the charge the WireCounter makes for a collective;
    torch's send is not wrapped, so the probe applies it). Fitted to latency + bytes / bandwidth
    on each size's best time: on a busy host the noise (a late wake-up) only ever adds.
    """
    if world < 2:
        return {"link_gbps": None, "link_latency_s": None}
    dst, src = (rank + 1) % world, (rank - 1) % world
    ready_out, ready_in = torch.zeros(1), torch.zeros(1)
    best = []
    for nbytes in sizes:
        send = torch.zeros(max(1, nbytes // 4))
        recv = torch.empty_like(send)
        samples = []
        for rep in range(reps + 1):
            incoming = dist.irecv(recv, src=src, tag=2)
            token = dist.isend(ready_out, dst=src, tag=1)
            dist.recv(ready_in, src=dst, tag=1)
            t = now()
            dist.send(send, dst=dst, tag=2)
            emu.link.delay(send.numel() * send.element_size(), 1)
            if rep:  # the first of each size is a warm-up
                samples.append(now() - t)
            token.wait()
            incoming.wait()
        best.append(min(samples))  # delays only add (a late wake-up, a busy core): the best
    dist.barrier()
    latency, slope = fit_transfer(list(sizes), best)
    return {
        "link_gbps": float(8 / slope / 1e9),
        "link_latency_s": float(latency),
        "link_bytes": list(sizes),
        "link_best_s": best,
    }


# -- S3 --------------------------------------------------------------------------------------


def probe_s3(data: RankData, budget_s: float = S3_BUDGET_S) -> dict:
    """First-byte latency and read throughput of the dataset's shards, through fsspec.

    Uses the filesystem the rank's cache already opened (its client is set up), and the cache's
    emulated object store when it has one, so that an emulated slow S3 shows here too.
    """
    manifest = data.manifest
    shards = sorted((s for split in manifest.splits.values() for s in split.shards),
                    key=lambda s: -s.bytes)
    fs, root = getattr(data.cache, "fs", None), getattr(data.cache, "root", None)
    if fs is None or root is None:
        fs, root = filesystem(manifest.url)
    store = getattr(data.cache, "store", None)
    delay = store.delay if getattr(store, "active", False) else None

    def get(key: str, **rng) -> int:
        t = now()
        got = fs.cat_file(f"{root}/{key}", **rng)
        if delay is not None:
            delay(len(got), t)
        return len(got)

    start = now()
    first = []
    for shard in shards[:2]:
        t = now()
        get(shard.key, start=0, end=1)
        first.append(now() - t)
    nbytes, t0 = 0, now()
    for shard in shards:
        nbytes += get(shard.key)
        if now() - start > budget_s:
            break
    seconds = now() - t0
    return {
        "s3_first_byte_s": float(statistics.median(first)) if first else None,
        "s3_read_mbps": float(nbytes * 8 / seconds / 1e6) if nbytes else None,
        "s3_bytes_probed": nbytes,
    }
