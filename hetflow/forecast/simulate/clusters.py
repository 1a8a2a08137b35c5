"""Simulated workers, built from the EC2 catalog (compute from FLOPs) or from a measured profile.

A worker is one device. From the catalog: c_i = per-sample FLOPs / (device FP32 peak x achieved
fraction), a_i = 0; a GPU instance gives one worker per GPU, each with its share of the NIC and
of the price. From a profile (`hetflow.records.Profile`): each rank's own fitted a_i + c_i x
batch and measured all-reduce bandwidth. Pure: the catalog (`hetflow.infra.catalog.Catalog`:
each type's `info`, `price` and `worker_price`) is passed in, not fetched.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

from pydantic import ValidationError

from hetflow.config import ClusterSpec, describe_validation_error
from hetflow.forecast.simulate.job import ModelSpec, SimulationError, WorkerModel, check_workers
from hetflow.perf.collective import ring_hops
from hetflow.records import Profile


def flops_worker(
    name: str, model: ModelSpec, peak_tflops: float, fraction: float, **kw
) -> WorkerModel:
    """A worker whose compute comes from device figures: c = FLOPs / (peak x achieved fraction)."""
    if not (math.isfinite(fraction) and 0 < fraction <= 1):
        raise SimulationError(f"achieved fraction: must be in (0, 1] (got {fraction!r})")
    if not (math.isfinite(peak_tflops) and peak_tflops > 0):
        raise SimulationError(f"worker {name}: peak TFLOP/s must be > 0 (got {peak_tflops!r})")
    per_sample_s = model.per_sample_flops / (peak_tflops * 1e12 * fraction)
    return WorkerModel(name=name, latency_s=0.0, per_sample_s=per_sample_s, **kw)


def fraction_for(fraction: float | Mapping[str, float], device: str) -> float:
    """The achieved fraction for a device: one figure for all, or by GPU family (`*`: the rest)."""
    if isinstance(fraction, Mapping):
        if device in fraction:
            return fraction[device]
        if "*" in fraction:
            return fraction["*"]
        raise SimulationError(
            f"achieved fraction: none given for device {device} (give DEVICE=F or *=F)"
        )
    return fraction


def parse_mix(text: str) -> list[tuple[str, int]]:
    """`"g4dn.xlarge:32,g5.xlarge:16"` -> [("g4dn.xlarge", 32), ("g5.xlarge", 16)] (instances)."""
    out: list[tuple[str, int]] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, count = part.rpartition(":")
        try:
            k = int(count)
        except ValueError:
            k = -1
        if not sep or not name or k < 1:
            raise SimulationError(
                f"--mix: expected TYPE:COUNT with COUNT >= 1, e.g. g5.xlarge:16 (got {part!r})"
            )
        out.append((name, k))
    if not out:
        raise SimulationError("--mix: at least one TYPE:COUNT is needed")
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise SimulationError(f"--mix: an instance type appears twice ({text!r})")
    return out


def scale_counts(counts: Sequence[int], n: int) -> list[int]:
    """n workers shared among kinds in proportion to `counts` (largest remainder, pure)."""
    total = sum(counts)
    exact = [c * n / total for c in counts]
    out = [math.floor(x) for x in exact]
    order = sorted(range(len(counts)), key=lambda i: (exact[i] - out[i], counts[i]), reverse=True)
    for i in order[: n - sum(out)]:
        out[i] += 1
    return out


def catalog_cluster(
    mix: Sequence[tuple[str, int]],
    catalog,
    model: ModelSpec,
    fraction: float | Mapping[str, float],
    n: int | None = None,
    storage_mbps: float | None = None,
) -> list[WorkerModel]:
    """Workers of EC2 instance types (`mix`: type and instance count), compute from FLOPs.

    With n: n workers in the mix's proportions (by workers), packed into whole instances; an
    instance only partly used is paid in full (its price spread over the workers on it).
    """
    infos = [catalog.info(name) for name, _ in mix]  # a CatalogError names an unknown type
    per_kind = [k * info.devices for (_, k), info in zip(mix, infos, strict=True)]
    if n is not None:
        check_workers(n)
        per_kind = scale_counts(per_kind, n)
    workers: list[WorkerModel] = []
    for (name, _), info, count in zip(mix, infos, per_kind, strict=True):
        if count == 0:
            continue
        price, peak = catalog.price(name), info.peak_tflops
        f = fraction_for(fraction, info.device)
        d = info.devices
        for inst in range(math.ceil(count / d)):
            on_node = min(d, count - inst * d)
            for j in range(on_node):
                workers.append(
                    flops_worker(
                        f"{name}#{inst}/{j}",
                        model,
                        peak,
                        f,
                        link_gbps=info.network_gbps / on_node,
                        node=f"{name}#{inst}",
                        storage_mbps=storage_mbps,
                        usd_per_hour=price / on_node,
                        kind=name,
                        device=info.device,
                    )
                )
    return workers


def spec_instance_types(cluster: ClusterSpec) -> list[str]:
    """The instance type of every worker of a cluster file; an error if one names none."""
    bare = [w.name for w in cluster.workers if not w.instance_type]
    if bare:
        raise SimulationError(
            f"--cluster: worker {bare[0]} names no instance_type; the simulator needs instance "
            "types (or pass a profile JSON from `hetflow profile --json`)"
        )
    return [w.instance_type for w in cluster.workers]


def spec_cluster(
    cluster: ClusterSpec,
    catalog,
    model: ModelSpec,
    fraction: float | Mapping[str, float],
    storage_mbps: float | None = None,
) -> list[WorkerModel]:
    """The workers of a cluster file whose workers name instance types, compute from FLOPs.

    A worker's own link and memory cap win over the catalog's; a worker costs its device's
    share of its instance; a worker without a `node` is a node of its own.
    """
    spec_instance_types(cluster)
    base = []
    for w in cluster.workers:
        info = catalog.info(w.instance_type)  # a CatalogError names an unknown type
        price, peak = catalog.worker_price(w.instance_type), info.peak_tflops
        node = w.node if "node" in w.model_fields_set else w.name
        base.append(
            flops_worker(
                w.name,
                model,
                peak,
                fraction_for(fraction, info.device),
                link_gbps=w.link_gbps or info.worker_link_gbps,
                node=node,
                storage_mbps=storage_mbps,
                cap=w.memory_cap_batch,
                usd_per_hour=price,
                kind=w.instance_type,
                device=info.device,
            )
        )
    return base


# -- a measured profile -----------------------------------------------------------------------


def as_profile(data: Mapping) -> Profile:
    """The `Profile` in a profile JSON (`hetflow profile --json` writes its fields with the
    report's beside them, which are left out); a SimulationError naming the field if invalid."""
    fields = {k: v for k, v in data.items() if k in Profile.model_fields}
    try:
        return Profile.model_validate(fields)
    except ValidationError as e:
        raise SimulationError(describe_validation_error(e, "profile")) from None


def profile_workers(profile: Profile) -> list[WorkerModel]:
    """Workers from a hetflow profile: a_i, c_i as the planner reads them
    (`RankProfile.step_model`), in rank order.

    The profile times the step through DDP, as training runs it, so nothing is added for DDP's
    work in backward. Each rank's link is its measured all-reduce bus bandwidth (a
    `Network.link_gbps` overrides it); every rank its own node (the local emulation gives each
    worker its own link). Storage is left out: training reads its shards through the local cache
    once, then from memory.
    """
    ranks = sorted(profile.ranks, key=lambda r: r.rank)
    if not ranks:
        raise SimulationError("profile: it holds no ranks")
    out = []
    for r in ranks:
        try:
            a, c = r.step_model()
        except ZeroDivisionError:
            raise SimulationError(
                f"profile: rank {r.rank} has neither fit_s_per_sample nor samples_per_s > 0"
            ) from None
        out.append(
            WorkerModel(
                name=r.worker or f"rank{r.rank}",
                latency_s=a,
                per_sample_s=c,
                link_gbps=r.allreduce_gbps or None,
                node=f"rank{r.rank}",
                cap=r.memory_cap_batch or None,
                kind=r.worker or "profiled",
            )
        )
    return out


def profile_alpha_s(profile: Profile) -> float:
    """Per-hop alpha from a profile: the slowest rank's all-reduce latency over its 2(n-1) hops."""
    n = len(profile.ranks)
    if n < 2:
        return 0.0
    return max(r.allreduce_latency_s for r in profile.ranks) / ring_hops(n)


# -- another size -----------------------------------------------------------------------------


def replicate(workers: Sequence[WorkerModel], n: int) -> list[WorkerModel]:
    """n workers cycling through `workers` (a measured mix at another size)."""
    check_workers(n)
    base = list(workers)
    k = len(base)
    return [
        replace(
            base[i % k],
            name=f"{base[i % k].name}.{i // k}",
            node=f"{base[i % k].node or base[i % k].name}.{i // k}",
        )
        for i in range(n)
    ]


def resized(base: Sequence[WorkerModel], n: int | None = None) -> list[WorkerModel]:
    """`base` at its own size (n None or len(base)), else `replicate(base, n)`."""
    return list(base) if n is None or n == len(base) else replicate(base, n)
