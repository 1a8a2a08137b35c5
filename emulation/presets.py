"""Emulated devices from published figures: how a GPU's step time grows with its batch.

An emulated worker's compute phase lasts `slowdown x host CPU time x shape(batch)`. A worker
given a speed alone has shape 1 (the host's curve times a scalar, which an affine step-time
model fits exactly), or with `curve: published` the presets' shapes interpolated to its speed
(`device_model.published_shape`). A preset's shape is its published
per-sample time at that batch over its best one: a GPU below its knee takes nearly as long for
a few samples as for many (T4 mixed precision: 7.6 ms for 1 image, 12.6 ms for 16), and some
lose throughput past their best batch, so no affine model fits them exactly, as no affine
model fits the hardware.

Source of every figure below (copied as published; one benchmark, one software stack, so the
devices compare like for like): NVIDIA DeepLearningExamples, MxNet/Classification/RN50v1.5/
README.md at commit 134510b4b7ff6225a76805b809e414fec3163071, "Inference performance
results": ResNet-50 v1.5, mixed precision, mxnet-20.12-py3 NGC container, average latency (ms)
per batch; A100 80GB (DGX A100), V100 16GB (DGX-1), T4. These are inference passes: a training
step is a forward and a backward pass (about 3x the work) whose shape in the batch follows
the same occupancy; the shape, not the absolute time, is what the emulator takes. A10G, L4 and
CPU instances have no preset: no per-batch table for them from a comparable benchmark was
found (give such a worker `speed`, `knee_batch` and `fixed_samples` yourself).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

SOURCE = (
    "NVIDIA DeepLearningExamples MxNet/Classification/RN50v1.5/README.md @134510b4, "
    "inference performance, mixed precision, average latency"
)


@dataclass(frozen=True)
class Preset:
    """A device's published step latency (ms) at each batch size it was measured at."""

    name: str
    latency_ms: dict[int, float]
    memory_gib: int

    @cached_property  # each emulated step asks (`shape`)
    def best_ms_per_sample(self) -> float:
        return min(ms / b for b, ms in self.latency_ms.items())

    @property
    def peak_samples_per_s(self) -> float:
        """Throughput at its best published batch: the preset's `speed`."""
        return 1e3 / self.best_ms_per_sample

    def shape(self, batch: int) -> float:
        """Per-sample time at `batch` over the best one (>= 1), interpolated in log(batch)
        between published batches; the nearest end's value outside them."""
        return _interpolated(self.latency_ms, batch) / batch / self.best_ms_per_sample


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "a100",
            {
                1: 2.15,
                2: 2.27,
                4: 2.39,
                8: 3.17,
                16: 4.31,
                32: 10.79,
                64: 14.07,
                128: 23.14,
                192: 30.97,
                256: 41.82,
            },
            80,
        ),
        Preset(
            "v100",
            {
                1: 3.48,
                2: 3.84,
                4: 4.39,
                8: 4.87,
                16: 6.78,
                32: 11.02,
                64: 19.78,
                128: 38.06,
                192: 60.40,
                256: 83.73,
            },
            16,
        ),
        Preset(
            "t4",
            {
                1: 7.61,
                2: 7.20,
                4: 10.67,
                8: 11.90,
                16: 12.62,
                32: 21.71,
                64: 40.98,
                128: 82.26,
                192: 124.26,
                256: 164.15,
            },
            16,
        ),
    )
}


def _interpolated(table: dict[int, float], batch: int) -> float:
    """Latency at `batch`: the published one, else linear in log(batch) between the nearest
    two, else the nearest end's per-sample time times `batch` (beyond: as many samples again
    cost as much again; below: a step of one sample is the floor)."""
    sizes = sorted(table)
    if batch in table:
        return table[batch]
    if batch < sizes[0]:
        return table[sizes[0]]
    if batch > sizes[-1]:
        return table[sizes[-1]] * batch / sizes[-1]
    hi = next(s for s in sizes if s > batch)
    lo = max(s for s in sizes if s < batch)
    t = (math.log(batch) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return table[lo] + t * (table[hi] - table[lo])


def knee_shape(batch: int, knee: int | None = None, fixed_samples: float = 0.0) -> float:
    """A worker's own shape: a step below `knee` lasts as long as at `knee`, and every step
    pays `fixed_samples` samples' worth on top; 1 at large batches (pure).

    >>> knee_shape(64), knee_shape(4, knee=16), knee_shape(32, knee=16, fixed_samples=8)
    (1.0, 4.0, 1.25)
    """
    if batch <= 0:
        return 1.0
    return (max(batch, knee or 1) + fixed_samples) / batch
