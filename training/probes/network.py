"""The network probes: the all-reduce (every rank at once) and this worker's own link.

Figures: `allreduce_latency_s`, `allreduce_gbps`, `grad_allreduce_s` (+ `allreduce_bytes`,
`allreduce_median_s`); `link_gbps`, `link_latency_s` (+ `link_bytes`, `link_best_s`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import torch
import torch.distributed as dist

from hetflow.emulation.emulator import Emulator, now
from hetflow.perf.collective import ring_allreduce_bytes
from hetflow.perf.fitting import fit_transfer
from hetflow.training.comm import WireCounter

ALLREDUCE_SIZES = (4_096, 65_536, 524_288, 2_097_152)
ALLREDUCE_REPS = 3  # timed, after one untimed warm-up per size
LINK_SIZES = (65_536, 524_288, 2_097_152)
LINK_REPS = 4


def probe_allreduce(
    world: int,
    counter: WireCounter,
    emu: Emulator,
    grad_bytes: int,
    device: str = "cpu",
    sizes: Sequence[int] = ALLREDUCE_SIZES,
    reps: int = ALLREDUCE_REPS,
) -> dict:
    """Each size (and the gradient's) timed from the barrier before it to the end of this rank's
    own link delay; per size the median, fitted to latency + ring wire bytes / bandwidth."""
    wire = ring_allreduce_bytes(1.0, world) if world > 1 else 1.0
    all_sizes = sorted({int(s) for s in sizes} | {int(grad_bytes)})
    medians = []
    for nbytes in all_sizes:
        buf = torch.zeros(max(1, nbytes // 4), device=device)
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


def probe_link(
    rank: int,
    world: int,
    emu: Emulator,
    device: str = "cpu",
    sizes: Sequence[int] = LINK_SIZES,
    reps: int = LINK_REPS,
) -> dict:
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
    ready_out, ready_in = torch.zeros(1, device=device), torch.zeros(1, device=device)
    best = []
    for nbytes in sizes:
        send = torch.zeros(max(1, nbytes // 4), device=device)
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
