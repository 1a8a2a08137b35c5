"""The memory probe: bytes per sample of the activations, the fixed part, the largest batch.

Figures: `memory_per_sample_bytes`, `memory_fixed_bytes`, `memory_available_bytes`,
`memory_cap_batch`.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable

import torch
from torch import nn

from hetflow.training.recipes import Recipe, parameter_count
from hetflow.training.recipes.digits import Classifier

MEMORY_HEADROOM = 0.8  # the activations' share of the available memory the cap may fill


def saved_activation_bytes(model: nn.Module, xb, yb, recipe: Recipe | None = None) -> int:
    """Bytes autograd keeps for backward in one forward pass of `recipe.loss` (default: a
    classifier's cross-entropy) on (xb, yb) (each storage once, no parameters)."""
    recipe = recipe or Classifier()
    device = next(model.parameters()).device
    batch = tuple(t.to(device) for t in recipe.batch(xb, yb))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in params:
            seen[ptr] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss, _ = recipe.loss(model, batch)
    del loss
    return sum(seen.values()) + sum(t.numel() * t.element_size() for t in batch)


def available_memory_bytes(device: torch.device | None = None) -> int:
    """Memory this rank may use: free memory of its CUDA `device`, else its share of the host's
    MemAvailable."""
    if device is not None and device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
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


def fits_on_device(model: nn.Module, x, y, recipe: Recipe, batch: int) -> bool:
    """Whether a forward and backward of `batch` samples (the samples at hand repeated to size)
    fit on the model's CUDA device: False on `torch.cuda.OutOfMemoryError`. The gradients, what
    a failed pass held (collected, not left to the next try) and the allocator's cache are
    freed after, either way."""
    try:
        _forward_backward(model, x, y, recipe, batch)
        fits = True
    except torch.cuda.OutOfMemoryError:
        fits = False
    finally:
        model.zero_grad(set_to_none=True)
    gc.collect()  # a failed pass's activations live as long as its traceback's frames
    torch.cuda.empty_cache()
    return fits


def _forward_backward(model: nn.Module, x, y, recipe: Recipe, batch: int) -> None:
    device = next(model.parameters()).device
    reps = -(-batch // len(x))
    xb = torch.as_tensor(x).repeat(reps, *[1] * (x.ndim - 1))[:batch]
    yb = torch.as_tensor(y).repeat(reps, *[1] * (y.ndim - 1))[:batch]
    data = tuple(t.to(device) for t in recipe.batch(xb.numpy(), yb.numpy()))
    loss, _ = recipe.loss(model, data)
    loss.backward()


def largest_fitting(fits: Callable[[int], bool], limit: int, rounds: int = 4) -> int:
    """The largest batch in 0..`limit` that `fits` (pure but for `fits`'s own calls): a b
    whose last try fitted and where b + 1's last try, made after b's search ended, did not
    (b + 1 is not tried past `limit`); 0 where 1 does not fit.

    Each round steps up from the last b known to fit, doubling the step until a try fails,
    then bisects; then b + 1 is tried again. A try on a GPU can fail once and fit later (a
    failed pass's memory not yet freed), so where b + 1 fits now, the next round goes on up
    from it; after `rounds` rounds the last b that fitted is returned as it is.

    >>> largest_fitting(lambda b: b <= 192, limit=1 << 14)
    192
    """
    lo = 0
    for _ in range(rounds):
        lo = _boundary(fits, lo, limit)
        if lo >= limit or not fits(lo + 1):
            return lo
        lo += 1
    return lo


def _boundary(fits: Callable[[int], bool], lo: int, limit: int) -> int:
    """From `lo` (known to fit) up: a b that fitted, b + 1 having failed (or `limit`)."""
    step = 1
    while lo < limit:
        b = min(lo + step, limit)
        if not fits(b):
            break
        lo, step = b, step * 2
    else:
        return lo
    hi = b
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def cuda_cap_batch(
    model: nn.Module, x, y, recipe: Recipe, headroom: float = 0.9, limit: int = 1 << 16
) -> int:
    """The largest local batch whose forward and backward fit on the model's CUDA device, by
    an out-of-memory search (`largest_fitting` over `fits_on_device`, the samples at hand
    repeated to size); `headroom` of it, for the optimizer state and the allocator's
    fragmentation a long run adds (never below 1 where 1 fits). 0 when not even one sample
    fits."""
    lo = largest_fitting(lambda b: fits_on_device(model, x, y, recipe, b), limit)
    return max(int(lo * headroom), min(lo, 1))


def probe_memory(model: nn.Module, x, y, optimizer: str, recipe: Recipe | None = None) -> dict:
    """Activation bytes at two batch sizes give the bytes per sample; the fixed part is
    parameters + gradients + optimizer state (+ what the activations do not scale with); the
    cap is the largest batch whose activations fit in MEMORY_HEADROOM of the available memory
    on a CPU, and on CUDA the out-of-memory search's (`cuda_cap_batch`)."""
    small, large = max(1, min(8, len(x) // 2)), max(2, min(64, len(x)))
    if large <= small:
        small, large = 1, 2
    m_small = saved_activation_bytes(model, x[:small], y[:small], recipe)
    m_large = saved_activation_bytes(model, x[:large], y[:large], recipe)
    per_sample = max((m_large - m_small) / (large - small), 1.0)
    state_copies = {"sgd": 1}.get(optimizer, 2)  # momentum; Adam(W) moments
    fixed = parameter_count(model) * 4 * (2 + state_copies) + max(0.0, m_small - per_sample * small)
    avail = available_memory_bytes(next(model.parameters()).device)
    cap = int((avail * MEMORY_HEADROOM - fixed) // per_sample)
    if next(model.parameters()).device.type == "cuda":  # measured, not modelled
        cap = cuda_cap_batch(model, x, y, recipe or Classifier())
    return {
        "memory_per_sample_bytes": float(per_sample),
        "memory_fixed_bytes": float(fixed),
        "memory_available_bytes": avail,
        "memory_cap_batch": max(cap, 0),
    }
