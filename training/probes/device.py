"""Raw device figures: matmul GFLOP/s and memory bandwidth, dilated like a compute phase.

Figures: `matmul_gflops`, `memory_gbps`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hetflow.emulation.emulator import Emulator, now


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


def probe_matmul(emu: Emulator, device: str = "cpu", n: int = 256) -> float:
    """GFLOP/s of an n x n fp32 matmul on this rank's device (dilated like compute)."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    out = torch.empty(n, n, device=device)
    seconds = _best_dilated(emu, lambda: torch.mm(a, b, out=out))
    return 2 * n**3 / seconds / 1e9


def probe_memory_bandwidth(emu: Emulator, device: str = "cpu", nbytes: int = 8 * 2**20) -> float:
    """GB/s of a tensor copy on this rank's device (bytes read + bytes written), dilated like
    compute."""
    src = torch.ones(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    seconds = _best_dilated(emu, lambda: dst.copy_(src))
    return 2 * nbytes / seconds / 1e9
