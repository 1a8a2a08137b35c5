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
