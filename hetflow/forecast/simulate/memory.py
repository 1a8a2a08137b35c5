"""The largest local batch a device's memory holds, as recommend checks it (pure figures).

A device training a model holds the model's state, `STATE_BYTES_PER_PARAM` bytes per
parameter (fp32 weights, gradients and two optimizer moments, as Adam and LAMB keep; SGD with
momentum keeps one, so the rule errs towards fewer samples), and per sample of its local batch
the activations kept for the backward pass, `ModelSpec.sample_memory_bytes`. The largest
local batch is then

    floor((device memory - state) / memory per sample)

A model's memory per sample is derived from a published training configuration, the local
batch a vendor trains it at on a device of known memory (`per_sample_bytes`): that batch fits,
so the figure is an upper bound on what one sample takes there, allocator and workspace
included, and the caps it gives are on the safe side. The figure and its source are the
model's (`simulate.models`); a measured cap (a profile's `memory_cap_batch`, from the profile
history) wins over it. Where either figure is missing, memory is not checked, and the
recommendation says so (`MemoryLimit.note`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MIB = 2**20
GIB = 2**30
STATE_BYTES_PER_PARAM = 16  # fp32 weights, gradients and two optimizer moments


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


def largest_batch(device_bytes: float, params: int, sample_bytes: float) -> int:
    """The most samples a device of `device_bytes` holds beside the model's state (0: not
    even its state).

    >>> largest_batch(16 * GIB, 25_600_000, per_sample_bytes(16 * GIB, 256, 25_600_000))
    256
    """
    room = device_bytes - state_bytes(params)
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


def device_limit(model, gpu: str | None, device_mib: int, measured_cap: int | None) -> MemoryLimit:
    """The largest local batch of `model` (a `ModelSpec`) on one device of `device_mib` MiB
    (0: not known) of GPU `gpu`, or the profile history's `measured_cap` where there is one."""
    if measured_cap is not None:
        return MemoryLimit(measured_cap, "measured: the profile history's memory_cap_batch")
    if model.sample_memory_bytes is None:
        return MemoryLimit(None, f"no memory per sample is known for {model.name}")
    if not device_mib:
        return MemoryLimit(None, f"the catalog gives no device memory for {gpu or 'its CPU'}")
    device = device_mib * MIB
    cap = largest_batch(device, model.params, model.sample_memory_bytes)
    why = (
        f"{device / GIB:.3g} GiB {gpu} less {model.name}'s state, "
        f"{state_bytes(model.params) / 1e9:.2g} GB, at "
        f"{model.sample_memory_bytes / 1e6:.3g} MB a sample: {model.memory_source}"
    )
    return MemoryLimit(cap, why)
