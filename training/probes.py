"""Probes that measure a worker as training will run it (inside the cluster, under torchrun).

Probes of an emulated worker measure the emulation (time dilation, link delay); they never
read its settings.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from training.comm import WireCounter
from training.data import RankData
from training.emulation import emulator_for, now
from training.job import RunSpec
from training.models import build_model, parameter_count


def profile(spec: RunSpec, data: RankData, rank: int, world: int, counter: WireCounter) -> dict:
    """Measure this rank as training will run it: fwd+bwd at a few batch sizes, then all-reduce."""
    emu = emulator_for(spec, rank)
    model = build_model(spec.train.model, data.manifest.features, data.manifest.classes)
    x, y = torch.from_numpy(data.train.x), torch.from_numpy(data.train.y)
    sizes, times = [], []
    for bsz in spec.profile_batches:
        xb, yb = x[:bsz], y[:bsz]
        for rep in range(4):
            t = now()
            emu.start()
            nn.functional.cross_entropy(model(xb), yb).backward()
            emu.finish()
            model.zero_grad(set_to_none=True)
            if rep:  # the first is a warm-up
                sizes.append(bsz)
                times.append(now() - t)
    slope, intercept = np.polyfit(sizes, times, 1)
    ref = max(1, spec.train.global_batch // world)
    step_at_ref = max(intercept + slope * ref, 1e-9)
    grad_bytes = parameter_count(model) * 4
    ar_bytes, ar_times = [], []
    for nbytes in (4_096, 262_144, max(grad_bytes, 1_048_576)):
        buf = torch.zeros(nbytes // 4)
        for rep in range(4):
            dist.barrier()
            t = now()
            dist.all_reduce(buf)
            sent, ncoll = counter.take()
            emu.link.delay(sent, ncoll)
            if rep:
                ar_bytes.append(nbytes)
                ar_times.append(now() - t)
    ar_slope, ar_intercept = np.polyfit(ar_bytes, ar_times, 1)
    wire = 2 * (world - 1) / world if world > 1 else 1.0
    grad_allreduce_s = max(ar_intercept + ar_slope * grad_bytes, 0.0)
    return {
        "samples_per_s": ref / step_at_ref,
        "fit_latency_s": float(intercept),
        "fit_s_per_sample": float(slope),
        "allreduce_latency_s": float(max(ar_intercept, 0.0)),
        "allreduce_gbps": float(wire * 8 / ar_slope / 1e9) if ar_slope > 0 else float("inf"),
        "grad_bytes": grad_bytes,
        "grad_allreduce_s": grad_allreduce_s,
        "step_compute_s": float(step_at_ref),
    }


