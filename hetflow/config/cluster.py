"""What a user writes about the machines of a job: each worker (`WorkerSpec`: a cloud
instance, or a device emulated on this host with a curve of its own) and the cluster
(`ClusterSpec`: how it is launched, how it is emulated); re-exported by `hetflow.config`."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_serializer, model_validator
from pydantic.json_schema import SkipJsonSchema

from hetflow.config.base import ConfigModel, finite_positive, load_mapping, one_of
from hetflow.emulation.device_model import NOISE_LEVELS, Device, Noise
from hetflow.emulation.links import LINKS
from hetflow.emulation.presets import PRESETS

# The emulator's noise by default (`ClusterSpec.noise`, which sets `jitter` and `pauses`): the
# level `alone`, what a real CPU worker with a core to itself shows step to step
# (`hetflow bench noise --ranks 1`; the figures: docs/measurements/emulation.md).
NOISE = "alone"
NOISE_JITTER = NOISE_LEVELS[NOISE].cv
NOISE_PAUSES = NOISE_LEVELS[NOISE].pauses


def preset_speed(preset: str) -> float:
    """A device preset's relative speed: its peak samples/s / 1000, e.g. 't4' -> 1.5617."""
    return round(PRESETS[preset].peak_samples_per_s / 1e3, 4)


class WorkerSpec(ConfigModel):
    """One worker of the cluster: a cloud instance, or one emulated on this machine."""

    name: str = Field(title="Name", description="Unique worker name, e.g. 'w0' or 'g5-a'.")
    instance_type: str | None = Field(
        None, title="Instance type", description="EC2 instance type, e.g. 'g5.xlarge' (optional)."
    )
    speed: float = Field(
        1.0,
        title="Relative speed (emulation)",
        description="Emulated compute speed relative to the other workers; the profiler must "
        "rediscover it by measurement. Ignored in the cloud.",
    )
    link_gbps: float | None = Field(
        None,
        title="Link bandwidth, Gbit/s (emulation)",
        description="Emulated network bandwidth of this worker; empty means loopback speed.",
    )
    link_latency_ms: SkipJsonSchema[float] = Field(
        0.0, ge=0, title="Link latency, ms (emulation)", description="Added per collective."
    )
    link: SkipJsonSchema[str | None] = Field(
        None,
        title="Link preset (emulation)",
        description=f"One of {', '.join(LINKS)} (hetflow/emulation/links.py cites each): sets "
        "link_gbps and the latency per collective, unless they are given.",
    )
    memory_cap_batch: SkipJsonSchema[int | None] = Field(
        None, ge=1, title="Max local batch", description="Largest local batch that fits memory."
    )
    node: SkipJsonSchema[str] = Field(
        "node0", title="Node", description="Host this worker runs on (for hierarchical averaging)."
    )
    device: Literal["auto", "cuda", "cpu"] = Field(
        "auto",
        title="Device",
        description="'auto': the local rank's CUDA device where the host has one, else the CPU.",
    )
    precision: SkipJsonSchema[Literal["fp32", "bf16", "fp16", "auto"] | None] = Field(
        None, title="Precision", description="This worker's own; empty: the train config's."
    )
    cpus: SkipJsonSchema[int | None] = Field(
        None,
        ge=1,
        title="CPU cores",
        description="Cores of its own this worker's process is pinned to, with as many torch "
        "threads (local launcher); empty: not pinned, `threads_per_rank` threads.",
    )
    cpu_quota: SkipJsonSchema[float | None] = Field(
        None,
        ge=0.1,
        title="CPU quota, cores",
        description="This worker's share of the CPU, in cores (0.25: a quarter of one core's "
        "time), enforced by the kernel's CFS bandwidth controller in a cgroup of its own "
        "(root, cgroup v1 or v2; local launcher and Ray), with as many torch threads: real "
        "unequal workers on one host; at least 0.1. Empty: no quota.",
    )
    gpu_share: SkipJsonSchema[int | None] = Field(
        None,
        ge=1,
        le=100,
        title="GPU share, %",
        description="This worker's share of its GPU's streaming multiprocessors under NVIDIA "
        "MPS (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE; local launcher): several workers of "
        "different real speeds on one GPU. Empty: no MPS for this worker.",
    )

    preset: str | None = Field(
        None,
        title="Device preset (emulation)",
        description="An emulated device whose step time follows a published per-batch curve: "
        f"{', '.join(PRESETS)} (hetflow/emulation/presets.py cites each); sets `speed` to its "
        "peak samples/s / 1000 unless `speed` is given.",
        json_schema_extra={"enum": list(PRESETS)},
        # Left out of dumps when empty: the Prefect form starts from the default cluster's
        # dump, and its server refuses a null that is not one of the enum's values.
        exclude_if=lambda v: v is None,
    )
    knee_batch: SkipJsonSchema[int | None] = Field(
        None,
        ge=1,
        title="Knee batch (emulation)",
        description="A step below this local batch lasts as long as at it (a GPU not filled); "
        "empty (and no fixed_samples): the curve `curve` says. Not with a preset.",
    )
    curve: SkipJsonSchema[Literal["host", "published"]] = Field(
        "host",
        title="Curve (emulation)",
        description="A worker of a speed alone: 'host', the host's own curve times the speed "
        "(the speed holds at every batch); 'published', the published curve of a device of this "
        "speed, its knee and fixed cost (hetflow/emulation/device_model.py). A preset has its "
        "own; knee_batch or fixed_samples give one of your own.",
    )
    fixed_samples: SkipJsonSchema[float] = Field(
        0.0,
        ge=0.0,
        title="Fixed cost per step, in samples (emulation)",
        description="Every step also pays this many samples' worth of the worker's compute (a "
        "launch or optimizer cost that does not grow with the batch). Not with a preset.",
    )
    cliff_batch: SkipJsonSchema[int | None] = Field(
        None,
        ge=1,
        title="Memory cliff batch (emulation)",
        description="Past this local batch a step lasts cliff_factor times longer (it no longer "
        "fits the device's fast memory); empty: no cliff.",
    )
    cliff_factor: SkipJsonSchema[float] = Field(
        1.0,
        ge=1.0,
        title="Memory cliff factor (emulation)",
        description="How many times longer a step past cliff_batch lasts.",
    )

    @field_validator("speed")
    @classmethod
    def _speed(cls, v: float) -> float:
        return finite_positive("speed", v)

    @field_validator("preset")
    @classmethod
    def _preset(cls, v: str | None) -> str | None:
        return one_of(v, PRESETS)

    @field_validator("link")
    @classmethod
    def _link_preset(cls, v: str | None) -> str | None:
        return one_of(v, LINKS)

    @model_validator(mode="before")
    @classmethod
    def _link_figures(cls, data):
        """A link preset's bandwidth and latency, where the worker gives none of its own."""
        if isinstance(data, dict) and data.get("link") in LINKS:
            link = LINKS[data["link"]]
            data = {"link_gbps": link.gbps, "link_latency_ms": link.latency_ms, **data}
        return data

    @model_validator(mode="after")
    def _preset_speed(self) -> WorkerSpec:
        """A preset's worker runs at its peak samples/s / 1000 (`preset_speed`) unless a speed
        was given: the speed follows the preset wherever it is read (a file, a form, the CLI),
        since a derived speed is never recorded as given (`_derived_speed_left_out`). Change a
        preset by validating a new dict, not by assignment."""
        if self.preset is not None and "speed" not in self.model_fields_set:
            object.__setattr__(self, "speed", preset_speed(self.preset))  # not marked as set
        return self

    @model_serializer(mode="wrap")
    def _derived_speed_left_out(self, handler):
        """A dump leaves out a speed derived from the preset, so that what reads it back (a
        form's defaults, a job file, a saved block) derives it again from its own preset."""
        data = handler(self)
        if self.preset is not None and "speed" not in self.model_fields_set:
            data.pop("speed", None)
        return data

    @model_validator(mode="after")
    def _share_of_a_gpu(self) -> WorkerSpec:
        if self.gpu_share is not None and self.device == "cpu":
            raise ValueError("gpu_share: a share of a GPU, but this worker's device is 'cpu'")
        return self

    @model_validator(mode="after")
    def _preset_or_own_curve(self) -> WorkerSpec:
        if self.preset is not None:
            for own in ("knee_batch", "fixed_samples"):
                if getattr(self, own):  # not None, not 0 (a job file writes both)
                    raise ValueError(f"{own}: not with a preset, whose curve is published")
        return self

    @model_validator(mode="after")
    def _cliff(self) -> WorkerSpec:
        if self.cliff_factor > 1 and self.cliff_batch is None:
            raise ValueError("cliff_factor: a cliff needs cliff_batch, the batch it starts past")
        return self

    def emulated(self) -> Device:
        """This worker as an emulated device (`hetflow.emulation.device_model.Device`)."""
        return Device(
            speed=self.speed,
            preset=self.preset,
            knee_batch=self.knee_batch,
            fixed_samples=self.fixed_samples,
            cliff_batch=self.cliff_batch,
            cliff_factor=self.cliff_factor,
            curve=self.curve,
        )

    def shape(self, batch: int) -> float:
        """How much longer than the host's curve x `speed` a step of `batch` lasts here (>= 1;
        `hetflow.emulation.device_model.Device.shape`)."""
        return self.emulated().shape(batch)

    @field_validator("link_gbps")
    @classmethod
    def _link(cls, v: float | None) -> float | None:
        return finite_positive("link_gbps", v)


class ClusterSpec(ConfigModel):
    """The workers of one job, and how this machine emulates them; in a cluster file also
    `market`, where cloud instances are rented (on-demand or spot)."""

    name: str = Field("local", title="Cluster name")
    workers: list[WorkerSpec] = Field(min_length=1, title="Workers")
    emulate: bool = Field(
        True,
        title="Emulate",
        description="Dilate time on this machine to emulate the workers' speeds and links. "
        "Off in the cloud, where the same code measures real instances.",
    )
    time_scale: float = Field(
        8.0,
        ge=1.0,
        title="Time scale (emulation)",
        description="The fastest emulated worker runs this many times slower than one core of "
        "this machine, so that the ranks do not fight over the cores.",
    )
    noise: str = Field(
        NOISE,
        title="Step-time noise (emulation)",
        description=f"One of {', '.join(NOISE_LEVELS)}, each measured on real workers "
        "(docs/measurements/emulation.md): 'alone', a worker with a core to itself; 'shared', "
        "two workers sharing the host, with slow stretches that last several steps. Sets "
        "`jitter` and `pauses` where they are not given.",
        json_schema_extra={"enum": list(NOISE_LEVELS)},
    )
    jitter: SkipJsonSchema[float] = Field(
        NOISE_JITTER,
        ge=0.0,
        le=1.0,
        title="Step-time jitter (emulation)",
        description="Coefficient of variation of each emulated compute step's time (default: "
        "the `noise` level's); its steps stay correlated as the level's are; 0 runs every "
        "step of a batch size at the worker's own pace.",
    )
    pauses: SkipJsonSchema[float] = Field(
        NOISE_PAUSES,
        ge=0.0,
        le=0.5,
        title="Pauses per step (emulation)",
        description="Probability that an emulated compute step lasts 2.3x its time (a host's "
        "hiccup; default: the `noise` level's); 0: none.",
    )

    launcher: Literal["local", "ray"] = Field(
        default_factory=lambda: os.environ.get("HETFLOW_LAUNCHER") or "local",
        validate_default=True,
        title="Launcher",
        description="'local': torchrun on this host; 'ray': Ray Train on the Ray cluster at the "
        "Ray address, each worker on a node labelled with its instance type. Empty: "
        "$HETFLOW_LAUNCHER where the cluster is read (the flow run's), else 'local'.",
    )
    ray_address: str | None = Field(
        None,
        title="Ray address",
        description="'auto', HOST:6379 or ray://HOST:10001; empty: $RAY_ADDRESS where the flow "
        "runs (the Prefect worker's), else 'auto'.",
    )
    market: SkipJsonSchema[Literal["on-demand", "spot"]] = Field(
        "on-demand",
        title="Market",
        description="Where the workers' cloud instances are rented: 'on-demand' or 'spot' "
        "(`hetflow recommend` writes the market it chose; the Ray launcher's YAML asks for spot "
        "nodes). Set in the cluster file; nothing on this machine depends on it.",
    )

    @field_validator("noise")
    @classmethod
    def _noise_level(cls, v: str) -> str:
        return one_of(v, NOISE_LEVELS)

    @model_validator(mode="before")
    @classmethod
    def _noise_figures(cls, data):
        """The noise level's jitter and pauses, where the cluster gives none of its own."""
        if isinstance(data, dict) and data.get("noise") in NOISE_LEVELS:
            level = NOISE_LEVELS[data["noise"]]
            data = {"jitter": level.cv, "pauses": level.pauses, **data}
        return data

    def step_noise(self) -> Noise:
        """The emulator's noise: the level's slow stretches with this cluster's `jitter` and
        `pauses`."""
        return replace(NOISE_LEVELS[self.noise], cv=self.jitter, pauses=self.pauses)

    @model_validator(mode="after")
    def _unique_names(self) -> ClusterSpec:
        seen: set[str] = set()
        for w in self.workers:
            if w.name in seen:
                raise ValueError(f"worker name {w.name!r} appears twice")
            seen.add(w.name)
        typed = [w.name for w in self.workers if w.instance_type]
        if self.launcher == "ray" and typed and len(typed) < len(self.workers):
            loose = next(w.name for w in self.workers if not w.instance_type)
            raise ValueError(
                f"workers[{loose}].instance_type: under the ray launcher every worker names its "
                f"instance type or none does ({', '.join(typed)} do); a worker with none could "
                "take a node another worker needs"
            )
        return self

    @property
    def world_size(self) -> int:
        return len(self.workers)

    def slowdowns(self) -> list[float]:
        """Time dilation per worker: the fastest runs `time_scale` times slower than a core."""
        fastest = max(w.speed for w in self.workers)
        return [self.time_scale * fastest / w.speed for w in self.workers]

    @classmethod
    def from_speeds(cls, speeds: list[float | str], **kw) -> ClusterSpec:
        """Workers `w0`, `w1`, ... of these relative speeds, or of these presets (a name:
        `w2-t4`), in order."""
        workers = [
            WorkerSpec(name=f"w{i}-{s}", preset=s)
            if isinstance(s, str)
            else WorkerSpec(name=f"w{i}", speed=s)
            for i, s in enumerate(speeds)
        ]
        return cls(workers=workers, **kw)

    @classmethod
    def from_file(cls, path: str | Path) -> ClusterSpec:
        return cls.model_validate(load_mapping(path))
