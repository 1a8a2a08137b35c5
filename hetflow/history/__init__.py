"""The profile history per worker type: what one worker of a type measured, under a key that
says when a later run may reuse it (pure records and the key; where the entries are stored and
which a run may use: `hetflow.history.store`).

A `TypeKey` holds everything that makes a worker's figures what they are: its kind (instance
type, else emulated preset, else declared speed), the job's recipe and options, global batch,
optimizer, strategy, precision and device, the torch and hetflow versions, and on an emulated
cluster what makes the emulated figures: the worker's slowdown (the cluster's time scale x the
fastest worker's speed / its own), its curve, its link on the emulated clock, the noise and the
host. Two workers with equal keys measure alike; an entry is reused only under an equal key.

    >>> from hetflow.config import ClusterSpec, TrainConfig
    >>> c = ClusterSpec.from_speeds([1, 2, 2])
    >>> keys = [type_key(c, i, TrainConfig(), host="h", torch="2.5") for i in range(3)]
    >>> keys[1] == keys[2], keys[0] == keys[1], keys[0].emulation.slowdown
    (True, False, 16.0)
    >>> keys[1].slug()[:8]
    'speed-2-'
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import re
from importlib import metadata

from pydantic import BaseModel, ConfigDict

from hetflow.config import ClusterSpec, TrainConfig
from hetflow.records import RankProfile

MEASURED_NOW = "measured now"


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EmulatedFigures(_Frozen):
    """What makes an emulated worker's figures: the dilation of its compute (`slowdown`, its
    `knee_batch` / `fixed_samples` curve, else the published curve of its `speed`; a preset's
    is in the key's kind; a memory cliff), its link as the
    emulator charges it (`Link`: bandwidth over the time scale, latency times it), the noise,
    and the host it is emulated on."""

    slowdown: float
    knee_batch: int | None = None
    fixed_samples: float = 0.0
    speed: float | None = None  # the curve of a worker with none of its own follows it
    cliff_batch: int | None = None
    cliff_factor: float = 1.0
    link_gbps: float | None = None  # on the emulated clock; None: loopback
    link_latency_s: float = 0.0
    jitter: float
    pauses: float
    noise: str = "alone"  # the level: how long its slow stretches last
    host: str


def kind_slug(kind: str) -> str:
    """A worker kind as the start of its entries' folder names: `<kind_slug>-<16 hex>`."""
    return re.sub(r"[^A-Za-z0-9.]+", "-", kind).strip("-")


class TypeKey(_Frozen):
    """When a worker's measured figures may be reused: all of it equal (module docstring)."""

    kind: str
    recipe: str
    recipe_options: dict[str, int | float | str] = {}
    global_batch: int
    optimizer: str
    strategy: str
    precision: str
    device: str
    threads: int
    torch: str
    hetflow: str
    emulation: EmulatedFigures | None = None

    def __hash__(self) -> int:  # recipe_options is a dict: hash the key's JSON
        return hash(self.model_dump_json())

    def slug(self) -> str:
        """The entry folder's name: the kind, readable, then a hash of the whole key."""
        digest = hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]
        return f"{kind_slug(self.kind)}-{digest}"


class TypeEntry(BaseModel):
    """One worker of a type as a profile measured it: its `RankProfile` (rank and name as
    measured), when, in which profile, and where its link figures came from: 'measured' (the
    worker's own sends in a profile of 2+ ranks) or 'declared' (a profile of one rank measures
    no link: the cluster's or the catalog's link, or the loopback assumed where none is set)."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    key: TypeKey
    rank: RankProfile
    measured_at: str  # `tasks.profile.profile_stamp` of the profile
    link_source: str = "measured"
    cluster: str = ""
    world_size: int = 1
    host_ranks: int = 1  # the ranks that shared its host's memory (a CPU's cap is its share)
    stored_at: str | None = None

    def age_h(self, now: dt.datetime | None = None) -> float:
        """Hours since it was measured."""
        then = dt.datetime.strptime(self.measured_at, "%Y%m%dT%H%M%S%fZ").replace(tzinfo=dt.UTC)
        return ((now or dt.datetime.now(dt.UTC)) - then).total_seconds() / 3600


def versions() -> tuple[str, str]:
    """(torch, hetflow) as installed, read without importing torch."""
    return metadata.version("torch"), metadata.version("hetflow")


def worker_kind(cluster: ClusterSpec, i: int) -> str:
    """'g5.xlarge', 'preset-t4' or 'speed-2' for worker i."""
    w = cluster.workers[i]
    if w.instance_type:
        return w.instance_type
    return f"preset-{w.preset}" if w.preset else f"speed-{w.speed:g}"


def emulated_figures(cluster: ClusterSpec, i: int, host: str) -> EmulatedFigures | None:
    """Worker i's `EmulatedFigures`; None when the cluster is not emulated."""
    if not cluster.emulate:
        return None
    w, scale = cluster.workers[i], cluster.time_scale
    return EmulatedFigures(
        slowdown=round(cluster.slowdowns()[i], 6),
        knee_batch=w.knee_batch,
        fixed_samples=w.fixed_samples,
        speed=w.speed,
        cliff_batch=w.cliff_batch,
        cliff_factor=w.cliff_factor,
        link_gbps=round(w.link_gbps / scale, 9) if w.link_gbps else None,
        link_latency_s=round(w.link_latency_ms / 1e3 * scale, 9),
        jitter=cluster.jitter,
        pauses=cluster.pauses,
        noise=cluster.noise,
        host=host,
    )


def type_key(
    cluster: ClusterSpec,
    i: int,
    train: TrainConfig,
    host: str | None = None,
    torch: str | None = None,
) -> TypeKey:
    """Worker i's key in `cluster` for the job `train` (host: this one; torch: installed)."""
    w = cluster.workers[i]
    torch_v, hetflow_v = versions()
    return TypeKey(
        kind=worker_kind(cluster, i),
        recipe=train.recipe,
        recipe_options=train.recipe_options,
        global_batch=train.global_batch,
        optimizer=train.optimizer,
        strategy=train.strategy,
        precision=w.precision or train.precision,
        device=w.device,
        threads=w.cpus or train.threads_per_rank,
        torch=torch or torch_v,
        hetflow=hetflow_v,
        emulation=emulated_figures(cluster, i, host or os.uname().nodename),
    )


def source_of(entry: TypeEntry) -> str:
    """'<entry URL> (<age> h old)'."""
    return f"{entry.stored_at} ({entry.age_h():.1f} h old)"


def sources_of(
    keys: list[TypeKey], measure: list[int], known: dict[TypeKey, TypeEntry], names: list[str]
) -> list[str]:
    """Per worker: 'measured now', 'measured now (as <the worker of its type measured>)', or
    the entry reused (`source_of`).

    >>> from hetflow.config import ClusterSpec, TrainConfig
    >>> c = ClusterSpec.from_speeds([1, 1, 2])
    >>> keys = [type_key(c, i, TrainConfig(), host="h") for i in range(3)]
    >>> sources_of(keys, [0, 2], {}, ["a", "b", "c"])
    ['measured now', 'measured now (as a)', 'measured now']
    """
    first = {keys[i]: names[i] for i in measure}
    return [
        MEASURED_NOW
        if i in measure
        else f"{MEASURED_NOW} (as {first[k]})"
        if k in first
        else source_of(known[k])
        for i, k in enumerate(keys)
    ]
