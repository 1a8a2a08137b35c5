"""The collectives' times on the ring's alpha-beta model (pure figures, no torch).

On a ring of n ranks, a reduce-scatter and an all-gather each take n - 1 hops, each hop
paying the latency alpha and moving 1/n of the bytes at the narrowest link's bandwidth; an
all-reduce is the two, 2(n-1) hops. The bytes on the wire are
`hetflow.training.comm.ring_allreduce_bytes`'s. Every caller's all-reduce time comes from
here: the planner's (from one measured over the whole cluster, `measured_ring`), the profile
assembled from the history's links, the simulator's and the rental search's (over nodes), the
queue's allocator, and a DiLoCo round's outer all-reduce.

>>> round(ring_allreduce_time(100e6, 4, 25e-6, 10.0), 6)  # 6 hops + 150 MB at 10 Gbit/s
0.12015
>>> reduce_scatter_time(100e6, 4, 25e-6, 10.0) + all_gather_time(100e6, 4, 25e-6, 10.0)
0.12015
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hetflow.errors import ConfigError

MIB = 2**20
DDP_BUCKET_BYTES = 25 * MIB  # torch DDP's bucket_cap_mb default
DDP_FIRST_BUCKET_BYTES = 1 * MIB  # torch DDP's first bucket (dist._DEFAULT_FIRST_BUCKET_BYTES)
RING_ALPHA_S = 25e-6  # per ring hop between nodes
RING_INTRA_ALPHA_S = 5e-6  # per ring hop inside a node

# Intra-node all-reduce bus bandwidth per GPU family, Gbit/s: what nccl-tests' all_reduce_perf
# reports as "busbw" inside one 8-GPU server, rounded: V100 NVLink 2 (DGX-1 / p3.16xlarge,
# p3dn.24xlarge) ~130 GB/s; A100 NVSwitch (DGX A100 / p4d) ~230 GB/s; H100 NVSwitch (DGX H100 /
# p5) ~450 GB/s. GPUs without NVLink (g4dn, g5, g6 multi-GPU sizes) share PCIe: Gen3 x16
# ~12 GB/s (T4), Gen4 x16 ~24 GB/s (A10G, L4). These are approximate, order-of-magnitude
# figures that infra.catalog does not carry (EC2's describe_instance_types has no interconnect
# bandwidth); override with Network.intra_gbps.
INTRA_NODE_GBPS: dict[str, float] = {
    "V100": 1040.0,
    "A100": 1840.0,
    "H100": 3600.0,
    "H200": 3600.0,
    "T4": 96.0,
    "T4g": 96.0,
    "A10G": 192.0,
    "L4": 192.0,
    "L40S": 192.0,
    "CPU": 400.0,  # shared memory inside one host
}
DEFAULT_INTRA_GBPS = 96.0


def ddp_buckets(
    grad_bytes: float,
    first_bucket_bytes: float = DDP_FIRST_BUCKET_BYTES,
    bucket_bytes: float = DDP_BUCKET_BYTES,
) -> int:
    """All-reduces per step: DDP's small first bucket, then buckets of bucket_bytes."""
    if grad_bytes <= first_bucket_bytes:
        return 1
    return 1 + math.ceil((grad_bytes - first_bucket_bytes) / bucket_bytes)


def _check(n: int) -> None:
    if n < 1:
        raise ConfigError(f"workers: must be >= 1 (got {n})")


def ring_hops(n: int) -> int:
    """The hops of one ring all-reduce over n ranks: 2(n-1)."""
    return 2 * (n - 1)


def ring_allreduce_bytes(nbytes: float, n: int) -> float:
    """Bytes one rank sends in a ring all-reduce of `nbytes` over n ranks: 2(n-1)/n x B; 0 on
    one rank (what the wire counter charges and the link probe fits its bandwidth to)."""
    return 2 * (n - 1) / n * nbytes if n > 1 else 0.0


def _half_ring(nbytes: float, n: int, alpha_s: float, gbps: float, collectives: int) -> float:
    """n - 1 hops, each alpha and 1/n of the bytes: a reduce-scatter's or an all-gather's."""
    _check(n)
    if n == 1:
        return 0.0
    return collectives * (n - 1) * alpha_s + (n - 1) / n * nbytes * 8 / (gbps * 1e9)


def reduce_scatter_time(
    nbytes: float, n: int, alpha_s: float, gbps: float, collectives: int = 1
) -> float:
    """A ring reduce-scatter of `nbytes` over n ranks: (n-1) x alpha + (n-1)/n x bytes x beta."""
    return _half_ring(nbytes, n, alpha_s, gbps, collectives)


def all_gather_time(
    nbytes: float, n: int, alpha_s: float, gbps: float, collectives: int = 1
) -> float:
    """A ring all-gather of `nbytes` (the whole, gathered) over n ranks: as a reduce-scatter."""
    return _half_ring(nbytes, n, alpha_s, gbps, collectives)


def ring_allreduce_time(
    nbytes: float, n: int, alpha_s: float, gbps: float, collectives: int = 1
) -> float:
    """Ring all-reduce of `nbytes` over n ranks, a reduce-scatter then an all-gather:
    collectives x 2(n-1) x alpha + 2(n-1)/n x bytes x beta (beta = 1 / bandwidth, bytes/s);
    0 on one rank; an infinite bandwidth leaves the hops' latency."""
    return reduce_scatter_time(nbytes, n, alpha_s, gbps, collectives) + all_gather_time(
        nbytes, n, alpha_s, gbps, collectives
    )


def outer_allreduce_time(
    nbytes: float, n: int, alpha_s: float, gbps: float, every: int = 1, collectives: int = 1
) -> float:
    """A round's outer all-reduce (DiLoCo, local SGD: the parameters' change averaged once
    every `every` inner steps), per inner step: the ring all-reduce over `every`."""
    return ring_allreduce_time(nbytes, n, alpha_s, gbps, collectives) / every


@dataclass(frozen=True)
class MeasuredRing:
    """An all-reduce measured over `world` ranks (`measured_s`, of which `latency_s` is its
    fixed part, the hops' latency), read as the ring model: alpha per hop and the bytes'
    time per ring-byte, so that it can be carried to a ring of another size (`time`)."""

    measured_s: float
    world: int
    latency_s: float = 0.0

    def time(self, ranks: int) -> float:
        """The all-reduce over `ranks` ranks: the fixed part scales with the hops, 2(n-1), the
        rest with the bytes each rank moves, 2(n-1)/n; 0 on one rank, which reduces nothing.

        >>> round(MeasuredRing(0.007, 8).time(4), 4)  # bandwidth-bound: 14% less
        0.006
        >>> round(MeasuredRing(0.007, 8, latency_s=0.007).time(4), 4)  # latency-bound: 57% less
        0.003
        """
        if ranks <= 1 or self.world <= 1:
            return 0.0
        fixed = min(max(self.latency_s, 0.0), self.measured_s)
        moved = self.measured_s - fixed
        hops, world_hops = ring_hops(ranks), ring_hops(self.world)
        return fixed * hops / world_hops + moved * (hops / ranks) / (world_hops / self.world)


def measured_ring(measured_s: float, world: int, ranks: int, latency_s: float = 0.0) -> float:
    """`MeasuredRing(measured_s, world, latency_s).time(ranks)`."""
    return MeasuredRing(measured_s, world, latency_s).time(ranks)
