"""The ring all-reduce as the simulator and `hetflow recommend` count it: its alpha-beta time,
DDP's buckets, and the intra-node bus of each GPU family (pure figures, no torch; the
simulator's `Network` takes its defaults from here).
"""

from __future__ import annotations

import math

from hetflow.config import ConfigError

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


def ring_allreduce_time(
    nbytes: float, n: int, alpha_s: float, gbps: float, collectives: int = 1
) -> float:
    """Ring all-reduce of `nbytes` over n ranks:
    collectives x 2(n-1) x alpha + 2(n-1)/n x bytes x beta.

    beta = 1 / bandwidth (bytes/s). Same wire bytes as `hetflow.training.comm.ring_allreduce_bytes`.
    """
    if n < 1:
        raise ConfigError(f"workers: must be >= 1 (got {n})")
    if n == 1:
        return 0.0
    return collectives * 2 * (n - 1) * alpha_s + 2 * (n - 1) / n * nbytes * 8 / (gbps * 1e9)
