"""The largest local batch a device's memory holds, as recommend checks it (pure figures).

A device training a model holds the model's state, `STATE_BYTES_PER_PARAM` bytes per
parameter (fp32 weights, gradients and two optimizer moments, as Adam and LAMB keep; SGD with
momentum keeps one, so the rule errs towards fewer samples), and per sample of its local batch
the activations kept for the backward pass. Of the device's memory, a share `MEMORY_MARGIN`
is not counted as room: what the driver does not hand out (a T4 sold and listed as 16 GB
reports 15360 MiB), the CUDA context and the libraries' workspaces, and the allocator's
fragmentation. The largest local batch is then

    floor(((1 - MEMORY_MARGIN) x device memory - state) / memory per sample)

A model's memory per sample is derived from a published training configuration, the local
batch a vendor trains it at on a device of known memory (`per_sample_bytes`): that batch fits,
so the figure is an upper bound on what one sample takes there, allocator and workspace
included. The published configurations are mixed precision, whose kept activations are 2
bytes each; an fp32 job keeps them in 4 (`ACTIVATION_BYTES`), so its memory per sample is
twice the published one (`sample_bytes_at`) and its cap about half: an upper bound again,
since mixed precision keeps some activations (normalisation, losses) in fp32 already. The
figure and its source are the model's (`simulate.models`); a measured cap (a profile's
`memory_cap_batch`, from the profile history, measured on the device itself) wins over it.
Where either figure is missing, memory is not checked, and the recommendation says so
(`MemoryLimit.note`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MIB = 2**20
GIB = 2**30
STATE_BYTES_PER_PARAM = 16  # fp32 weights, gradients and two optimizer moments
MEMORY_MARGIN = 0.10  # of a device's listed memory, not counted as room (module docstring)
# Bytes of one kept activation, by the job's precision; the models' published memory per
# sample is of PUBLISHED_PRECISION.
ACTIVATION_BYTES = {"mixed": 2, "fp32": 4}
PRECISIONS = tuple(ACTIVATION_BYTES)
PUBLISHED_PRECISION = "mixed"


def state_bytes(params: int) -> float:
    """What a model of `params` parameters holds before its first sample."""
    return float(STATE_BYTES_PER_PARAM * params)


def per_sample_bytes(device_bytes: float, batch: int, params: int) -> float:
    """Memory per sample of a model of `params` parameters that trains at local batch
    `batch` on a device of `device_bytes` (a published configuration): what the device holds
    beyond the state, shared by the batch.

    >>> round(per_sample_bytes(16 * GIB, 256, 25_600_000) / 1e6, 1)  # ResNet-50, V100 16 GB
    65.5
    """
    return (device_bytes - state_bytes(params)) / batch


def sample_bytes_at(published: float, precision: str) -> float:
    """Memory per sample at `precision` of a model whose published figure (at
    PUBLISHED_PRECISION) is `published`: scaled by the bytes of a kept activation.

    >>> sample_bytes_at(100.0, "mixed"), sample_bytes_at(100.0, "fp32")
    (100.0, 200.0)
    """
    if precision not in ACTIVATION_BYTES:
        raise ValueError(f"precision: {precision!r} is not one of {', '.join(PRECISIONS)}")
    return published * ACTIVATION_BYTES[precision] / ACTIVATION_BYTES[PUBLISHED_PRECISION]


def usable_bytes(device_bytes: float) -> float:
    """What of a device's listed memory counts as room: all but MEMORY_MARGIN of it."""
    return device_bytes * (1 - MEMORY_MARGIN)


def largest_batch(device_bytes: float, params: int, sample_bytes: float) -> int:
    """The most samples a device of `device_bytes` holds beside the model's state, the margin
    kept (0: not even its state).

    >>> largest_batch(16 * GIB, 25_600_000, per_sample_bytes(16 * GIB, 256, 25_600_000))
    229
    """
    room = usable_bytes(device_bytes) - state_bytes(params)
    return max(0, math.floor(room / sample_bytes + 1e-9))


@dataclass(frozen=True)
class MemoryLimit:
    """One device type's largest local batch (`cap`; None: not known) and where it comes
    from, in words (`why`)."""

    cap: int | None
    why: str

    def note(self, instance_type: str, top: int) -> str | None:
        """The recommendation's note on `instance_type`, whose largest local batch is `top`:
        capped by memory, or memory not checked; None where the cap is not reached."""
        if self.cap is None:
            return f"{instance_type}: memory not checked ({self.why})"
        if top >= self.cap:
            return f"{instance_type}: local batches capped at {self.cap} by memory ({self.why})"
        return None


def device_limit(
    model, gpu: str | None, device_mib: int, measured_cap: int | None, precision: str = "mixed"
) -> MemoryLimit:
    """The largest local batch of `model` (a `ModelSpec`) trained at `precision` (one of
    PRECISIONS) on one device of `device_mib` MiB (0: not known) of GPU `gpu`, or the profile
    history's `measured_cap` where there is one."""
    if measured_cap is not None:
        return MemoryLimit(measured_cap, "measured: the profile history's memory_cap_batch")
    if model.sample_memory_bytes is None:
        return MemoryLimit(None, f"no memory per sample is known for {model.name}")
    if not device_mib:
        return MemoryLimit(None, f"the catalog gives no device memory for {gpu or 'its CPU'}")
    device = device_mib * MIB
    per_sample = sample_bytes_at(model.sample_memory_bytes, precision)
    cap = largest_batch(device, model.params, per_sample)
    why = (
        f"{device / GIB:.3g} GiB {gpu} less a {MEMORY_MARGIN:.0%} margin and {model.name}'s "
        f"state, {state_bytes(model.params) / 1e9:.2g} GB, at {per_sample / 1e6:.3g} MB a "
        f"sample in {precision} precision, activations of {ACTIVATION_BYTES[precision]} "
        f"bytes: {model.memory_source}"
    )
    return MemoryLimit(cap, why)
