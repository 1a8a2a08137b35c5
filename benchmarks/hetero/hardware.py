"""`hetflow bench hetero`'s flags for each worker's hardware, checked before anything runs:
its device (`--devices`), cores (`--cpus`), kernel CPU quota (`--cpu-quotas`), share of a GPU
under MPS (`--gpu-shares`) and memory cap (`--memory-caps`). Each refusal is one line naming
the flag or field."""

from __future__ import annotations

import argparse

from hetflow.config import ClusterSpec, ConfigError
from hetflow.training.cores import core_sets, host_cores
from hetflow.training.cpu_quota import check_quotas
from hetflow.training.launch.mps import check_mps, mps_available


def parse_cpus(text: str | None, world: int) -> list[int | None]:
    """`--cpus`: each worker's cores, or none pinned (pure).

    >>> parse_cpus("1,2", 2), parse_cpus(None, 2)
    ([1, 2], [None, None])
    """
    if text is None:
        return [None] * world
    try:
        cpus = [int(c) for c in text.split(",")]
    except ValueError:
        raise ConfigError(f"--cpus: expected whole numbers, e.g. 1,2,4,8 (got {text!r})") from None
    if len(cpus) != world or min(cpus) < 1:
        raise ConfigError(f"--cpus: {world} counts of 1 or more expected (got {text!r})")
    return cpus


def parse_caps(text: str | None, world: int) -> list[int | None]:
    """`--memory-caps`: each worker's declared memory cap, None where left empty (pure).

    >>> parse_caps(",,,16", 4), parse_caps(None, 2)
    ([None, None, None, 16], [None, None])
    """
    if text is None:
        return [None] * world
    try:
        caps = [int(c) if c.strip() else None for c in text.split(",")]
    except ValueError:
        raise ConfigError(
            f"--memory-caps: expected whole numbers, e.g. ,,,16 (got {text!r})"
        ) from None
    if len(caps) != world or min((c for c in caps if c is not None), default=1) < 1:
        raise ConfigError(
            f"--memory-caps: {world} caps of 1 sample or more (or empty) expected (got {text!r})"
        )
    return caps


def parse_quotas(text: str) -> list[float]:
    """`--cpu-quotas`: each worker's share of the CPU, in cores (pure).

    >>> parse_quotas("1,0.5,0.25")
    [1.0, 0.5, 0.25]
    """
    try:
        quotas = [float(c) for c in text.split(",")]
    except ValueError:
        raise ConfigError(
            f"--cpu-quotas: expected numbers of cores, e.g. 1,0.5,0.25,0.25 (got {text!r})"
        ) from None
    if not all(q >= 0.1 for q in quotas):
        raise ConfigError(f"--cpu-quotas: every quota must be >= 0.1 cores (got {text!r})")
    return quotas


def parse_shares(text: str | None, world: int) -> list[int | None]:
    """`--gpu-shares`: each worker's MPS share in percent, None where left empty (pure).

    >>> parse_shares("10,,40", 3), parse_shares(None, 2)
    ([10, None, 40], [None, None])
    """
    if text is None:
        return [None] * world
    try:
        shares = [int(c) if c.strip() else None for c in text.split(",")]
    except ValueError:
        raise ConfigError(
            f"--gpu-shares: expected whole numbers, e.g. 10,20,30,40 (got {text!r})"
        ) from None
    if len(shares) != world or not all(1 <= s <= 100 for s in shares if s is not None):
        raise ConfigError(
            f"--gpu-shares: {world} shares of 1 to 100 (or empty) expected (got {text!r})"
        )
    return shares


def set_hardware(cluster: ClusterSpec, args: argparse.Namespace) -> None:
    """Each worker's --devices, --cpus, --gpu-shares and --memory-caps, checked in one line
    naming the flag or field: the cores asked for and MPS where a worker has a share of a GPU
    must exist here, before anything starts."""
    devices = (args.devices or "auto").split(",")
    if len(devices) not in (1, cluster.world_size):
        raise ConfigError(f"--devices: {len(devices)} devices for {cluster.world_size} workers")
    for i, w in enumerate(cluster.workers):
        w.device = devices[i % len(devices)]
    for w, cpus in zip(cluster.workers, parse_cpus(args.cpus, cluster.world_size), strict=True):
        w.cpus = cpus
    for w, share in zip(
        cluster.workers, parse_shares(args.gpu_shares, cluster.world_size), strict=True
    ):
        w.gpu_share = share
    for w, cap in zip(
        cluster.workers, parse_caps(args.memory_caps, cluster.world_size), strict=True
    ):
        w.memory_cap_batch = cap
    if args.cpu_quotas is not None:
        quotas = parse_quotas(args.cpu_quotas)
        if len(quotas) != cluster.world_size:
            raise ConfigError(
                f"--cpu-quotas: {len(quotas)} quotas for {cluster.world_size} workers (--speeds)"
            )
        for w, q in zip(cluster.workers, quotas, strict=True):
            w.cpu_quota = q
    core_sets(cluster, host_cores())
    check_quotas(cluster, len(host_cores()))
    check_mps(cluster, *mps_available())
