"""Each worker pinned to CPU cores of its own (`WorkerSpec.cpus`): workers of different real
speeds on one many-core host, with no time dilation (`ClusterSpec.emulate` off)."""

from __future__ import annotations

import os

import torch

from hetflow.config import ClusterSpec, ConfigError


def host_cores() -> list[int]:
    """The cores this process may run on."""
    return sorted(os.sched_getaffinity(0))


def core_sets(cluster: ClusterSpec, cores: list[int]) -> list[list[int] | None]:
    """Each worker's cores on a host whose usable cores are `cores` (pure): the workers that
    set `cpus` take consecutive cores in rank order, the others none (not pinned). A one-line
    ConfigError naming the field where they ask for more cores than the host has, or where the
    ranks run on other hosts (the Ray launcher).

    >>> from hetflow.config import WorkerSpec
    >>> c = ClusterSpec(workers=[WorkerSpec(name="a", cpus=1), WorkerSpec(name="b"),
    ...                          WorkerSpec(name="c", cpus=2)])
    >>> core_sets(c, [0, 1, 2, 3])
    [[0], None, [1, 2]]
    """
    pinned = [w for w in cluster.workers if w.cpus is not None]
    if pinned and cluster.launcher == "ray":
        raise ConfigError(
            f"cluster.workers[{pinned[0].name}].cpus: pinning cores needs the local launcher "
            "(under Ray each rank has its node's cores)"
        )
    asked = sum(w.cpus for w in pinned)
    if asked > len(cores):
        each = ", ".join(f"{w.name}: {w.cpus}" for w in pinned)
        raise ConfigError(
            f"cluster.workers[].cpus: {asked} cores asked ({each}), this host has {len(cores)}"
        )
    out: list[list[int] | None] = []
    at = 0
    for w in cluster.workers:
        out.append(None if w.cpus is None else cores[at : at + w.cpus])
        at += w.cpus or 0
    return out


def pin_rank(cluster: ClusterSpec, rank: int) -> None:
    """This process on its worker's own cores, with as many torch threads, where the worker
    sets `cpus`; nothing otherwise. Call it before the first torch operation."""
    mine = core_sets(cluster, host_cores())[rank]
    if mine is not None:
        os.sched_setaffinity(0, mine)
        torch.set_num_threads(len(mine))
