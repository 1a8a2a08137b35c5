"""The compute probe: forward+backward of the job's model as training wraps it (DDP, or
FSDP2 under `train.strategy: fsdp`), fitted in the batch.

Figures: `samples_per_s`, `fit_latency_s`, `fit_s_per_sample`, `step_compute_s` and the raw
samples (`compute_rounds`, `compute_batches`, `compute_best_s`, `compute_outlier_batch`).
"""

from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from hetflow.emulation.costs import SMOOTH_PHASES
from hetflow.emulation.emulator import Emulator, now
from hetflow.perf.fitting import robust_affine
from hetflow.training.devices import MixedPrecision, to_device
from hetflow.training.recipes import Recipe
from hetflow.training.recipes.digits import Classifier

COMPUTE_BUDGET_S = 2.0  # wall time of the compute probe (every rank alike)
# An emulated worker's step at a batch size is dilated from the least CPU time of its last
# SMOOTH_PHASES steps at that size: as many rounds as that, and the probe's best round is the
# same statistic as a settled training step (the least of SMOOTH_PHASES, not of fewer).
# How far training's step still lies from the profile: `compute_model_error` of
# `hetflow bench hetero` (measured: docs/measurements/emulation.md).
COMPUTE_MIN_ROUNDS = SMOOTH_PHASES
COMPUTE_MAX_ROUNDS = 15
# Every timed step starts at least this long after the previous one finished computing (an
# emulated worker's dilation pause counts). In training a worker computes after the all-reduce
# and the wait for the others, and caches cool in that pause; without it the fastest worker
# (short pauses) would look faster than it trains (measured: docs/measurements/emulation.md).
COMPUTE_PAUSE_S = 0.08


def solo_ddp(model: nn.Module, emu: Emulator) -> DDP:
    """`model` wrapped as training wraps it (DDP, the compute phase ended by the comm hook at the
    last bucket), reducing over a group of this rank alone, so that each rank may step on its own.

    DDP's own work in a step (forward bookkeeping, the reducer's hooks in backward) is part of
    a worker's compute and is dilated with it, so a probe of the bare model under-estimates a
    slow worker's step. `hetflow bench hetero` reports the gap per rank
    (`compute_model_error`: measured over planned compute at the first plan's batches).
    """
    solo, _ = dist.new_subgroups(group_size=1)  # every rank creates every group, in order
    device = next(model.parameters()).device
    ids = [device] if device.type == "cuda" else None
    net = DDP(model, device_ids=ids, process_group=solo, gradient_as_bucket_view=True)
    net.register_comm_hook(solo, emu.dilating_hook(default_hooks.allreduce_hook))
    return net


def solo_sharded(model: nn.Module, units: list[nn.Module]) -> nn.Module:
    """`model` sharded as `train.strategy: fsdp` shards it (each of `units` with parameters,
    then the root: `training.loop.sharded.shard_model`), over a mesh of this rank alone.

    Each rank steps on its own, yet pays FSDP's own work of a step (its hooks, the copies in
    and out of each unit's flat buffer, DTensor bookkeeping), which is part of a worker's
    compute and is dilated with it, as DDP's is in `solo_ddp`: under fsdp that work is the
    larger part of a small model's step on a CPU (docs/measurements/fsdp.md), and a plan
    priced from a DDP probe would not know it. The collectives' own time over a world of
    several ranks is not in it. The compute phase ends after backward (no comm hook).
    """
    from torch.distributed.device_mesh import DeviceMesh  # fsdp's: not a DDP rank's start
    from torch.distributed.fsdp import fully_shard

    solo, _ = dist.new_subgroups(group_size=1)  # every rank creates every group, in order
    mesh = DeviceMesh.from_group(solo, next(model.parameters()).device.type)
    for unit in units:
        if any(True for _ in unit.parameters()):
            fully_shard(unit, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _step(model: nn.Module, recipe: Recipe, batch: tuple[torch.Tensor, ...], amp=None) -> None:
    with amp.autocast() if amp is not None else contextlib.nullcontext():
        loss, count = recipe.loss(model, batch)
    (loss / max(count, 1)).backward()
    model.zero_grad(set_to_none=True)


def _step_timer(model: nn.Module, recipe: Recipe, batches: dict, emu: Emulator, amp=None):
    """A function timing one dilated step at a batch size, after the pause training has."""
    computed = now()

    def timed_step(b: int) -> float:
        nonlocal computed
        rest = COMPUTE_PAUSE_S - (now() - computed)
        if rest > 0:  # cool down as long as a step of training does (see COMPUTE_PAUSE_S)
            time.sleep(rest)
        t = now()
        emu.start(key=b)
        _step(model, recipe, batches[b], amp)
        end = emu.finish()  # a no-op when the model's comm hook has ended the phase
        computed = emu.computed_at
        return end - t

    return timed_step


def _timed_rounds(
    timed_step, sizes: list[int], budget_s: float
) -> tuple[dict[int, list[float]], int]:
    """Interleaved rounds (every size once, the order alternating) for `budget_s` of wall time,
    at least COMPUTE_MIN_ROUNDS and at most COMPUTE_MAX_ROUNDS; (times per size, rounds)."""
    times: dict[int, list[float]] = {b: [] for b in sizes}
    start = now()
    rounds = 0
    while rounds < COMPUTE_MAX_ROUNDS and (rounds < COMPUTE_MIN_ROUNDS or now() - start < budget_s):
        for b in sizes if rounds % 2 == 0 else sizes[::-1]:
            times[b].append(timed_step(b))
        rounds += 1
    return times, rounds


def probe_compute(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    emu: Emulator,
    sizes: list[int],
    ref: int,
    budget_s: float = COMPUTE_BUDGET_S,
    recipe: Recipe | None = None,
    amp: MixedPrecision | None = None,
) -> dict:
    """The step's time at each batch size (best of the rounds), fitted as a + b x batch with one
    outlying size left out (`robust_affine`); `samples_per_s` at the reference batch `ref`.
    A step is `recipe.loss` (default: a classifier's cross-entropy) on `recipe.batch` of the
    first b samples of (x, y), on the model's device, under `amp`'s autocast (the precision
    the rank trains in; default fp32)."""
    recipe = recipe or Classifier()
    sizes = sorted({max(1, min(int(b), len(x))) for b in sizes})
    if len(sizes) < 2:
        sizes = sorted({1, max(2, len(x) // 2)})
    device = str(next(model.parameters()).device)
    batches = {b: to_device(recipe.batch(x[:b], y[:b]), device) for b in sizes}
    for b in sizes:  # warm-up: allocations, kernel selection (not dilated, not timed)
        _step(model, recipe, batches[b], amp)
    timed_step = _step_timer(model, recipe, batches, emu, amp)
    # One dilated step, untimed: every timed step then follows a pause, as in training
    # (a step straight after the warm-up finds warm caches and runs faster).
    timed_step(sizes[0])
    times, rounds = _timed_rounds(timed_step, sizes, budget_s)
    # Interference on a shared host only ever adds time (a core taken, caches thrashed), so the
    # best of the rounds is the estimate nearest the worker's own speed; the median let one
    # burst of load spoil a slow worker's few rounds (measured: docs/measurements/emulation.md).
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
