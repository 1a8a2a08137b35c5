"""Probes that measure a worker as training will run it (inside the cluster, under torchrun).

Probes of an emulated worker measure the emulation, never read its settings: compute phases are
dilated by the worker's `Emulator` exactly as in a training step, each collective pays this
worker's own `Link` delay through the `WireCounter`, and S3 reads pay the cache's emulated
object store when there is one. The same code measures a real instance when emulation is off.

What each figure is and how it is taken (every rank runs every probe; rank 0 gathers them):

- **compute** (`samples_per_s`, `fit_latency_s`, `fit_s_per_sample`, `step_compute_s`):
  forward+backward of the job's model at `spec.profile_batches`, in interleaved rounds (every
  batch size once per round, the order alternating) for a fixed wall-time budget that starts on
  all ranks at once, so that every rank samples the same stretch of the host's load. Per batch
  size the median time; `time = a + b x batch` fitted by least squares to the medians.
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
  (rank by rank). Per size the median, fitted to `latency + wire bytes / bandwidth` with
  relative-error weights; wire bytes are the ring's 2(n-1)/n x B, so the bandwidth is the
  all-reduce "bus bandwidth" of nccl-tests. `link_gbps` is that bandwidth.
- **S3** (`s3_first_byte_s`, `s3_read_mbps`): 1-byte range reads of two shards (median), then
  whole shards, largest first, for up to 0.2 s, through fsspec at the dataset URL.

`probe_s` records how long each probe took on this rank.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from infra.s3 import filesystem
from training.comm import WireCounter
from training.data import RankData
from training.emulation import Emulator, emulator_for, now
from training.job import RunSpec
from training.models import build_model, parameter_count

T_ENTER = time.time()
COMPUTE_BUDGET_S = 2.0  # wall time of the compute probe (every rank alike)
COMPUTE_MIN_ROUNDS = 3
COMPUTE_MAX_ROUNDS = 15
ALLREDUCE_SIZES = (4_096, 65_536, 524_288, 2_097_152)
ALLREDUCE_REPS = 3  # timed, after one untimed warm-up per size
MEMORY_HEADROOM = 0.8
S3_BUDGET_S = 0.2


def profile(spec: RunSpec, data: RankData, rank: int, world: int, counter: WireCounter) -> dict:
    """Measure this rank as training will run it: compute, memory, all-reduce, S3 reads."""
    global T_PROBE
    T_PROBE = time.time()
    emu = emulator_for(spec, rank)
    model = build_model(spec.train.model, data.manifest.features, data.manifest.classes, spec.train.seed)
    x, y = torch.from_numpy(data.train.x), torch.from_numpy(data.train.y)
    took: dict[str, float] = {}

    def timed(name: str, fn: Callable, *args):
        t = now()
        out = fn(*args)
        took[name] = now() - t
        return out

    dist.barrier()  # start together: every rank's compute probe sees the same host load
    ref = max(1, spec.train.global_batch // world)
    comp = timed("compute", probe_compute, model, x, y, emu, list(spec.profile_batches), ref)
    mem = timed("memory", probe_memory, model, x, y, spec.train.optimizer)
    mm = timed("matmul", probe_matmul, emu)
    bw = timed("memory_bandwidth", probe_memory_bandwidth, emu)
    grad_bytes = parameter_count(model) * 4
    dist.barrier()
    ar = timed("allreduce", probe_allreduce, world, counter, emu, grad_bytes)
    s3 = timed("s3", probe_s3, data)
    return {"t_enter": T_ENTER, "t_probe": T_PROBE, "t_exit": time.time(), "load_s": data.load_s,
        **comp,
        **mem,
        "matmul_gflops": mm,
        "memory_gbps": bw,
        **ar,
        "grad_bytes": grad_bytes,
        **s3,
        "probe_s": took,
    }


# -- compute ---------------------------------------------------------------------------------


def fit_affine(xs: Sequence[float], ts: Sequence[float], weights: Sequence[float] | None = None
               ) -> tuple[float, float]:
    """(intercept, slope) of t = a + b x by (weighted) least squares; needs two distinct x."""
    x = np.asarray(xs, dtype=float)
    t = np.asarray(ts, dtype=float)
    if len(set(x.tolist())) < 2:
        raise ValueError("fit_affine: need at least two distinct x values")
    w = np.ones_like(x) if weights is None else np.sqrt(np.asarray(weights, dtype=float))
    design = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    (a, b), *_ = np.linalg.lstsq(design, t * w, rcond=None)
    return float(a), float(b)


def _step(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> None:
    nn.functional.cross_entropy(model(xb), yb).backward()
    model.zero_grad(set_to_none=True)


def probe_compute(model: nn.Module, x: torch.Tensor, y: torch.Tensor, emu: Emulator,
                  sizes: list[int], ref: int, budget_s: float = COMPUTE_BUDGET_S) -> dict:
    sizes = sorted({max(1, min(int(b), len(x))) for b in sizes})
    if len(sizes) < 2:
        sizes = sorted({1, max(2, len(x) // 2)})
    batches = {b: (x[:b], y[:b]) for b in sizes}
    for b in sizes:  # warm-up: allocations, kernel selection (not dilated, not timed)
        _step(model, *batches[b])
    times: dict[int, list[float]] = {b: [] for b in sizes}
    cpu: dict[int, list[float]] = {b: [] for b in sizes}
    start = now()
    rounds = 0
    while rounds < COMPUTE_MAX_ROUNDS and (rounds < COMPUTE_MIN_ROUNDS or now() - start < budget_s):
        order = sizes if rounds % 2 == 0 else sizes[::-1]
        for b in order:
            t = now()
            c = time.thread_time()
            emu.start()
            _step(model, *batches[b])
            cpu[b].append(time.thread_time() - c)
            emu.finish()
            times[b].append(now() - t)
        rounds += 1
    medians = [statistics.median(times[b]) for b in sizes]
    intercept, slope = fit_affine(sizes, medians)
    if slope <= 0:  # a flat or noisy curve: fall back to the largest batch's throughput
        slope, intercept = medians[-1] / sizes[-1], 0.0
    step_at_ref = max(intercept + slope * ref, 1e-9)
    return {
        "samples_per_s": ref / step_at_ref,
        "fit_latency_s": float(intercept),
        "fit_s_per_sample": float(slope),
        "step_compute_s": float(step_at_ref),
        "compute_rounds": rounds,
        "compute_batches": sizes,
        "compute_median_s": medians,
        "DBG_cpu": {b: cpu[b] for b in sizes}, "DBG_wall": {b: times[b] for b in sizes},
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
    wire_bytes = [wire * s for s in all_sizes]
    latency, slope = fit_affine(wire_bytes, medians, weights=[1 / t**2 for t in medians])
    if slope <= 0:
        slope = max(medians[-1] - max(latency, 0.0), 1e-12) / wire_bytes[-1]
    gbps = 8 / slope / 1e9
    return {
        "allreduce_latency_s": float(max(latency, 0.0)),
        "allreduce_gbps": float(gbps),
        "link_gbps": float(gbps),
        "grad_allreduce_s": float(max(latency, 0.0) + slope * wire * grad_bytes),
        "allreduce_bytes": all_sizes,
        "allreduce_median_s": medians,
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
