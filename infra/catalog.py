"""The EC2 catalog: what an instance type offers, what it costs, and how fast it should be.

Instance types come from the snapshot shipped in `infra/instance_types.json`, else from the EC2
API (boto3; with real AWS credentials EC2 answers for every type); prices from
`hetflow.infra.pricing`; peak FP32 FLOP/s from NVIDIA's datasheets (`DEVICE_PEAK_TFLOPS`), or
cores x clock for a CPU-only instance. A worker is one device: on an instance of n GPUs, one GPU
with 1/n of the price and network. Pure functions over a `Catalog`: `resolve_cluster` (speeds
and links of the named types), `seed_profile`, `cost_usd` (docs/ray.md).

    >>> network_gbps("Up to 25 Gigabit"), network_gbps("4x 100 Gigabit"), network_gbps("Moderate")
    (25.0, 400.0, 0.75)
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel

from hetflow.config import ClusterSpec
from hetflow.figures import RunMetrics
from hetflow.infra.pricing import DEFAULT_REGION, CatalogError, PriceTable, load_prices
from hetflow.records import Profile, RankProfile

DESCRIBE_CHUNK = 100  # describe_instance_types takes at most 100 names per call

# FP32 (non-tensor) peak TFLOP/s at boost clock, per device, from NVIDIA's product datasheets
# (T4, A10, L4, L40S, V100 SXM2, A100 SXM4, H100 SXM5, H200). The A10G of g5 instances is the
# AWS variant of the A10 and is listed at the A10's figure. Relative values are what count.
DEVICE_PEAK_TFLOPS: dict[str, float] = {
    "T4": 8.1,
    "T4g": 8.1,
    "A10G": 31.2,
    "L4": 30.3,
    "L40S": 91.6,
    "V100": 15.7,
    "A100": 19.5,
    "H100": 67.0,
    "H200": 67.0,
}
CPU_FLOP_PER_CYCLE = 32  # FP32 per core and cycle: two 256-bit FMA units (AVX2 / SVE-256)
NAMED_NETWORK_GBPS = {
    "very low": 0.05,
    "low": 0.3,
    "low to moderate": 0.5,
    "moderate": 0.75,
    "high": 1.0,
}


class InstanceInfo(BaseModel):
    """One EC2 instance type, as `describe_instance_types` reports it."""

    instance_type: str
    vcpus: int
    cores: int
    clock_ghz: float | None = None
    memory_mib: int
    gpus: int = 0
    gpu_name: str | None = None
    gpu_memory_mib: int = 0  # per GPU
    network: str  # EC2's wording, e.g. "Up to 25 Gigabit"
    network_gbps: float  # baseline bandwidth of all network cards together

    @property
    def devices(self) -> int:
        """Workers one instance holds: one per GPU, or one for a CPU-only instance."""
        return max(1, self.gpus)

    @property
    def device(self) -> str:
        return self.gpu_name or "CPU"

    @property
    def peak_tflops(self) -> float:
        """FP32 peak of one worker's device (one GPU, or the whole CPU of a CPU-only instance)."""
        if self.gpus:
            if self.gpu_name not in DEVICE_PEAK_TFLOPS:
                known = ", ".join(sorted(DEVICE_PEAK_TFLOPS))
                raise CatalogError(
                    f"{self.instance_type}: no peak FLOP/s known for GPU {self.gpu_name!r} "
                    f"(known: {known})"
                )
            return DEVICE_PEAK_TFLOPS[self.gpu_name]
        return self.cores * (self.clock_ghz or 2.5) * CPU_FLOP_PER_CYCLE / 1e3

    @property
    def worker_link_gbps(self) -> float:
        """One worker's share of the instance's baseline network bandwidth."""
        return self.network_gbps / self.devices


def network_gbps(text: str) -> float:
    """EC2's network performance wording in Gbit/s ('Up to' gives the burst figure)."""
    t = text.strip().lower()
    if t in NAMED_NETWORK_GBPS:
        return NAMED_NETWORK_GBPS[t]
    m = re.fullmatch(r"(?:up to )?(?:(\d+)x )?([\d.]+) gigabit", t)
    if not m:
        raise CatalogError(f"network performance {text!r}: not a figure this catalog can read")
    return float(m.group(1) or 1) * float(m.group(2))


def instance_info(raw: dict) -> InstanceInfo:
    """An `InstanceTypes` entry of describe_instance_types as an InstanceInfo."""
    name = raw["InstanceType"]
    vcpu = raw.get("VCpuInfo", {})
    gpus = raw.get("GpuInfo", {}).get("Gpus", [])
    net = raw.get("NetworkInfo", {})
    cards = [c for c in net.get("NetworkCards", []) if c.get("BaselineBandwidthInGbps")]
    perf = net.get("NetworkPerformance", "")
    bandwidth = sum(c["BaselineBandwidthInGbps"] for c in cards) if cards else network_gbps(perf)
    return InstanceInfo(
        instance_type=name,
        vcpus=int(vcpu.get("DefaultVCpus", 1)),
        cores=int(vcpu.get("DefaultCores", vcpu.get("DefaultVCpus", 1))),
        clock_ghz=raw.get("ProcessorInfo", {}).get("SustainedClockSpeedInGhz"),
        memory_mib=int(raw.get("MemoryInfo", {}).get("SizeInMiB", 0)),
        gpus=sum(int(g.get("Count", 0)) for g in gpus),
        gpu_name=gpus[0]["Name"] if gpus else None,
        gpu_memory_mib=int(gpus[0].get("MemoryInfo", {}).get("SizeInMiB", 0)) if gpus else 0,
        network=perf,
        network_gbps=float(bandwidth),
    )


def ec2_client(region: str | None = None):
    """boto3's EC2 client; the endpoint and credentials come from the standard AWS variables."""
    import boto3

    region = (
        region
        or os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
        or DEFAULT_REGION
    )
    return boto3.client("ec2", region_name=region)


def describe_instance_types(names: Iterable[str], client=None) -> dict[str, InstanceInfo]:
    """InstanceInfo per name, from describe_instance_types; CatalogError naming unknown types."""
    from botocore.exceptions import BotoCoreError, ClientError

    wanted = list(dict.fromkeys(names))
    client = client or ec2_client()
    found: dict[str, InstanceInfo] = {}
    for i in range(0, len(wanted), DESCRIBE_CHUNK):
        chunk = wanted[i : i + DESCRIBE_CHUNK]
        try:
            pages = client.get_paginator("describe_instance_types").paginate(InstanceTypes=chunk)
            for page in pages:
                for raw in page.get("InstanceTypes", []):
                    found[raw["InstanceType"]] = instance_info(raw)
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            if code.startswith("InvalidInstanceType"):
                unknown = [n for n in chunk if n not in found] or chunk
                bad = [n for n in unknown if n in e.response["Error"].get("Message", "")] or unknown
                raise CatalogError(
                    f"instance_type: EC2 does not know {', '.join(sorted(bad))}"
                ) from None
            raise CatalogError(f"EC2 describe_instance_types failed: {code or e}") from None
        except BotoCoreError as e:
            raise CatalogError(f"EC2 describe_instance_types failed: {e}") from None
    missing = [n for n in wanted if n not in found]
    if missing:
        raise CatalogError(f"instance_type: EC2 does not know {', '.join(sorted(missing))}")
    return found


SNAPSHOT = Path(__file__).with_name("instance_types.json")


def load_snapshot(path: str | Path = SNAPSHOT) -> dict[str, InstanceInfo]:
    """The shipped snapshot of the GPU families users train on (g4dn, g5, g6, p3, p3dn, p4d,
    p4de, p5; its `source` and `as_of` say where and when from)."""
    data = json.loads(Path(path).read_text())
    return {k: InstanceInfo.model_validate(v) for k, v in data["types"].items()}


def real_aws() -> bool:
    """Whether boto3 talks to AWS itself: credentials in the environment, no endpoint override."""
    has = os.environ.get("AWS_ACCESS_KEY_ID") or os.environ.get("AWS_PROFILE")
    return bool(has) and not os.environ.get("AWS_ENDPOINT_URL")


def lookup_types(names: Iterable[str], client=None) -> dict[str, InstanceInfo]:
    """InstanceInfo per name, offline where it can be: the snapshot's rows, EC2
    (`describe_instance_types`) for the types it lacks; with real AWS credentials EC2's answer
    for every type (a refresh), the snapshot standing in if EC2 fails. A CatalogError names
    types neither knows."""
    wanted = list(dict.fromkeys(names))
    snapshot = load_snapshot()
    if real_aws() and client is None:
        try:
            return describe_instance_types(wanted)
        except CatalogError:
            pass
    found = {n: snapshot[n] for n in wanted if n in snapshot}
    rest = [n for n in wanted if n not in found]
    if rest:
        try:
            found.update(describe_instance_types(rest, client))
        except CatalogError as e:
            if "does not know" not in str(e):  # EC2 unreachable: say what the snapshot lacks
                known = ", ".join(sorted({k.split(".")[0] for k in snapshot}))
                raise CatalogError(
                    f"instance_type: {', '.join(rest)} not in the shipped catalog ({known}), "
                    f"and {e}"
                ) from None
            raise
    return found


class Catalog(BaseModel):
    """Instance types (from EC2) and their prices (from a table that names its source)."""

    types: dict[str, InstanceInfo]
    prices: PriceTable

    @classmethod
    def from_ec2(
        cls, names: Iterable[str], prices: PriceTable | None = None, client=None
    ) -> Catalog:
        return cls(types=describe_instance_types(names, client), prices=prices or load_prices())

    @classmethod
    def for_cluster(
        cls, cluster: ClusterSpec, prices: PriceTable | None = None, client=None
    ) -> Catalog:
        """The catalog of the instance types a cluster names (an empty one if it names none)."""
        names = [w.instance_type for w in cluster.workers if w.instance_type]
        return cls.for_types(names, prices, client)

    @classmethod
    def for_types(
        cls, names: Iterable[str], prices: PriceTable | None = None, client=None
    ) -> Catalog:
        """The catalog of `names`, offline where it can be (`lookup_types`)."""
        names = list(names)
        types = lookup_types(names, client) if names else {}
        return cls(types=types, prices=prices or load_prices())

    def info(self, instance_type: str) -> InstanceInfo:
        if instance_type not in self.types:
            raise CatalogError(f"instance_type: {instance_type!r} is not in the catalog")
        return self.types[instance_type]

    def price(self, instance_type: str) -> float:
        self.info(instance_type)
        return self.prices.price(instance_type)

    def worker_price(self, instance_type: str) -> float:
        """USD per hour of one worker: its device's share of the instance."""
        return self.price(instance_type) / self.info(instance_type).devices

    def relative_peak(self, instance_types: list[str]) -> list[float]:
        """Peak FLOP/s of each worker's device relative to the fastest (= 1.0)."""
        peaks = [self.info(t).peak_tflops for t in instance_types]
        top = max(peaks)
        return [p / top for p in peaks]


def resolve_cluster(cluster: ClusterSpec, catalog: Catalog, link_scale: float = 1.0) -> ClusterSpec:
    """A cluster whose workers name EC2 types, with speed and link filled from the catalog.

    speed: the device's peak FLOP/s relative to the fastest named device (so the emulation's
    slowdowns follow the catalog); link_gbps: the worker's share of its instance's baseline
    network bandwidth, divided by `link_scale` (an emulated device is far slower than a real
    one; scaling the links keeps communication's share of a step closer to the real one).
    Values a worker sets itself win (a link_gbps or a speed given in the file stay).
    Naming types for some workers but not others is an error: their speeds would not share a
    unit. A cluster that names no type is returned as it is.
    """
    named = [w for w in cluster.workers if w.instance_type]
    if not named:
        return cluster
    if len(named) != len(cluster.workers):
        bare = ", ".join(w.name for w in cluster.workers if not w.instance_type)
        raise CatalogError(
            "cluster.workers: name an instance_type for every worker or for none "
            f"({bare} names none)"
        )
    if not (math.isfinite(link_scale) and link_scale > 0):
        raise CatalogError(f"link_scale: must be a finite number > 0 (got {link_scale})")
    speeds = catalog.relative_peak([w.instance_type for w in cluster.workers])
    workers = []
    for w, speed in zip(cluster.workers, speeds, strict=True):
        info = catalog.info(w.instance_type)
        update = {}
        if "speed" not in w.model_fields_set:
            update["speed"] = round(speed, 6)
        if "link_gbps" not in w.model_fields_set:
            update["link_gbps"] = round(info.worker_link_gbps / link_scale, 6)
        workers.append(w.model_copy(update=update))
    out = cluster.model_copy(update={"workers": workers})
    return ClusterSpec.model_validate(out.model_dump())


def seed_profile(cluster: ClusterSpec, catalog: Catalog) -> Profile:
    """A profile the planner can use before anything is measured: speeds = relative peak FLOP/s.

    The fields of a measured profile's ranks that the planner reads; the unit of time is
    arbitrary (only ratios count), latencies are 0 and communication is unknown (0), so the
    plan is speed-proportional. Its `model` is '' (the seed holds for any model); the instance
    types are the cluster's (`cluster.workers[i].instance_type`).
    """
    if not all(w.instance_type for w in cluster.workers):
        raise CatalogError("seed_profile: every worker must name an instance_type")
    speeds = catalog.relative_peak([w.instance_type for w in cluster.workers])
    ranks = [
        RankProfile(
            rank=i,
            worker=w.name,
            samples_per_s=s,
            relative_speed=s,
            fit_latency_s=0.0,
            fit_s_per_sample=1.0 / s,
            step_compute_s=1.0 / s,
            grad_allreduce_s=0.0,
            allreduce_latency_s=0.0,
            allreduce_gbps=catalog.info(w.instance_type).worker_link_gbps,
        )
        for i, (w, s) in enumerate(zip(cluster.workers, speeds, strict=True))
    ]
    return Profile(cluster=cluster.name, model="", ranks=ranks, profiling_time_s=0.0)


def cost_usd(
    cluster: ClusterSpec, duration_s: float, catalog: Catalog, epochs: float | None = None
) -> dict:
    """What a run of `duration_s` costs: by worker, in total, per hour and per epoch.

    A worker that names no instance type (local emulation) costs nothing and is listed under
    `unpriced`. `per_epoch_usd` is total / epochs when the number of epochs is given (> 0).
    """
    if not (math.isfinite(duration_s) and duration_s >= 0):
        raise CatalogError(f"duration_s: must be a finite number >= 0 (got {duration_s})")
    hours = duration_s / 3600
    by_worker: dict[str, float] = {}
    unpriced: list[str] = []
    per_hour = 0.0
    for w in cluster.workers:
        if not w.instance_type:
            by_worker[w.name] = 0.0
            unpriced.append(w.name)
            continue
        rate = catalog.worker_price(w.instance_type)
        per_hour += rate
        by_worker[w.name] = rate * hours
    total = sum(by_worker.values())
    out = {
        "by_worker": by_worker,
        "total_usd": total,
        "usd_per_hour": per_hour,
        "duration_s": duration_s,
        "unpriced": unpriced,
        "price_source": f"{catalog.prices.source} (as of {catalog.prices.as_of})",
    }
    if epochs is not None:
        if not (math.isfinite(epochs) and epochs > 0):
            raise CatalogError(f"epochs: must be a finite number > 0 (got {epochs})")
        out["epochs"] = epochs
        out["per_epoch_usd"] = total / epochs
    return out


def with_cost(
    cluster: ClusterSpec,
    metrics: RunMetrics,
    samples_per_step: int,
    catalog: Catalog | None,
    epoch_samples: int | None,
) -> RunMetrics:
    """`metrics` with `cost_usd`, `cost_per_epoch_usd` and each launched rank's `cost_usd` of
    the training loop's time (`train_loop_s`; price x instance-hours, a GPU instance's price
    shared by its GPUs: `cost_usd`), when the workers name EC2 instance types; unchanged for
    workers that name none (a local emulation has no price). `cluster`: the workers the run
    finished on; `samples_per_step`: what one of `metrics.steps` takes (a round's samples
    under diloco), for the epochs of `epoch_samples`."""
    if catalog is None or not catalog.types:
        return metrics
    epochs = metrics.steps * samples_per_step / epoch_samples if epoch_samples else None
    cost = cost_usd(cluster, metrics.train_loop_s, catalog, epochs=epochs)
    by_rank = [cost["by_worker"][w.name] for w in cluster.workers]
    ranks = [r.model_copy(update={"cost_usd": by_rank[r.rank]}) for r in metrics.ranks]
    return metrics.model_copy(
        update={
            "cost_usd": cost["total_usd"],
            "cost_per_epoch_usd": cost.get("per_epoch_usd"),
            "ranks": ranks,
        }
    )
