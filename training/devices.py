"""Where each rank computes and in what precision: its device, the process group's backend,
the autocast dtype, and the loss scale every rank shares.

Decided before launch for every worker (`check_devices`: a one-line `ConfigError` naming the
worker) and again by each rank for itself (`rank_device_precision`). Device 'auto': the
local rank's CUDA device modulo the host's, else the CPU. Backend: NCCL when every rank has a
CUDA device of its own, else gloo. Precision 'auto': bf16 at CUDA compute capability 8.0 or
more (the capability is read: `torch.cuda.is_bf16_supported()` says True on a T4), fp16 with a
loss scaler below it, fp32 on a CPU. When any rank computes in fp16, every rank scales its loss
by one shared `GradScaler` scale, so all skip the same steps; `check_job` refuses fp16 with
local SGD. The policy for users: docs/gpus.md.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from hetflow.config import ClusterSpec, ConfigError, TrainConfig
from hetflow.infra.data.reader import peak_rss_bytes
from hetflow.training.faults.guard import SkipCount

PRECISIONS = {"bf16": torch.bfloat16, "fp16": torch.float16}
NATIVE_BF16_CAPABILITY = (8, 0)


@dataclass(frozen=True)
class HostDevices:
    """The CUDA devices of this host: how many, and each one's compute capability and memory."""

    capabilities: tuple[tuple[int, int], ...] = ()
    total_memory: tuple[int, ...] = ()

    @property
    def cuda_count(self) -> int:
        return len(self.capabilities)

    @classmethod
    def here(cls) -> HostDevices:
        if not torch.cuda.is_available():
            return cls()
        n = torch.cuda.device_count()
        return cls(
            tuple(torch.cuda.get_device_capability(i) for i in range(n)),
            tuple(torch.cuda.get_device_properties(i).total_memory for i in range(n)),
        )


def resolve_device(setting: str, local_rank: int, host: HostDevices, who: str = "worker") -> str:
    """'cuda:N' or 'cpu' for a worker whose `device` is `setting`, at `local_rank` on `host`."""
    if setting == "cpu" or (setting == "auto" and host.cuda_count == 0):
        return "cpu"
    if host.cuda_count == 0:
        raise ConfigError(f"{who}.device: 'cuda', but this machine has no CUDA device")
    return f"cuda:{local_rank % host.cuda_count}"


def native_bf16(device: str, host: HostDevices) -> bool:
    """Whether `device` computes bf16 natively (a CPU runs it under CPU autocast)."""
    if not device.startswith("cuda"):
        return True
    return host.capabilities[int(device.split(":")[1])] >= NATIVE_BF16_CAPABILITY


def resolve_precision(setting: str, device: str, host: HostDevices, who: str = "worker") -> str:
    """'fp32', 'bf16' or 'fp16' for `setting` on `device` (the policy in the module's doc)."""
    if setting == "auto":
        if not device.startswith("cuda"):
            return "fp32"
        return "bf16" if native_bf16(device, host) else "fp16"
    if setting == "bf16" and not native_bf16(device, host):
        cap = host.capabilities[int(device.split(":")[1])]
        raise ConfigError(
            f"{who}.precision: 'bf16', but {device} (compute capability {cap[0]}.{cap[1]}) has "
            "no native bf16; use 'fp16' or 'auto'"
        )
    return setting


def backend_for(devices: list[str]) -> str:
    """'nccl' when every rank has a CUDA device of its own, else 'gloo'."""
    cuda = [d for d in devices if d.startswith("cuda")]
    return "nccl" if len(cuda) == len(devices) and len(set(cuda)) == len(cuda) else "gloo"


@dataclass(frozen=True)
class Placement:
    """What the launcher decided for a job on this host: each rank's device and precision, the
    backend."""

    devices: list[str]
    precisions: list[str]
    backend: str

    @property
    def scaled(self) -> bool:
        """Whether every rank scales its loss (some rank computes in fp16)."""
        return "fp16" in self.precisions


def check_devices(
    cluster: ClusterSpec, train: TrainConfig, host: HostDevices | None = None
) -> Placement:
    """Every worker's device and precision on this host (local rank = its place in the
    cluster), and the backend; a one-line ConfigError naming the worker's field otherwise.
    Under the Ray launcher, the settings as written (each rank resolves its own on its node)
    and NCCL only where every worker asks for `cuda`."""
    if cluster.launcher == "ray":  # the ranks' hosts are not this one: each rank checks its own
        devices = [w.device for w in cluster.workers]
        backend = "nccl" if all(d == "cuda" for d in devices) else "gloo"
        return Placement(
            devices, [w.precision or train.precision for w in cluster.workers], backend
        )
    host = HostDevices.here() if host is None else host
    devices, precisions = [], []
    for i, w in enumerate(cluster.workers):
        who = f"cluster.workers[{w.name}]"
        device = resolve_device(w.device, i, host, who)
        devices.append(device)
        setting = w.precision or train.precision
        field = who if w.precision else "train"
        precisions.append(resolve_precision(setting, device, host, field))
    placement = Placement(devices, precisions, backend_for(devices))
    check_scaled_sync(cluster, placement, train)
    return placement


def check_scaled_sync(cluster: ClusterSpec, placement: Placement, train: TrainConfig) -> None:
    """A one-line ConfigError where a rank of `placement` computes in fp16 (its skipped steps
    must be the same on every rank) and `train` may run local SGD, which cannot promise it.
    The one rule of `check_devices` that reads a variant's knobs (its compression): a job of
    several variants checks it for each against the one placement (`training.job`)."""
    local = train.local_sgd()  # (field, method name) where local SGD may run
    if "fp16" in placement.precisions and local is not None:
        who = cluster.workers[placement.precisions.index("fp16")].name
        raise ConfigError(
            f"cluster.workers[{who}].precision: resolves to fp16 here, whose skipped steps must "
            f"be the same on every rank, which {local[1]} ({local[0]}) cannot promise; use "
            "bf16 or fp32"
        )


def autocast(device: str, precision: str):
    """The forward pass's autocast context for `precision` on `device` (none for fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=PRECISIONS[precision])


def to_device(batch: tuple[torch.Tensor, ...], device: str) -> tuple[torch.Tensor, ...]:
    """A recipe's batch on `device` (the host-to-device copy overlaps where memory is pinned)."""
    if device == "cpu":
        return batch
    return tuple(t.to(device, non_blocking=True) for t in batch)


def peak_device_bytes(device: str) -> int:
    """The most memory this rank held: CUDA's peak allocated on a GPU, else the process's
    peak resident memory."""
    if device.startswith("cuda"):
        return int(torch.cuda.max_memory_allocated(device))
    return peak_rss_bytes()


def synchronizer(device: str):
    """A function that waits for `device`'s queued work (CUDA), or None on a CPU: a compute
    phase is timed to its end on the device, not to the end of its launches."""
    if not device.startswith("cuda"):
        return None
    dev = torch.device(device)
    return lambda: torch.cuda.synchronize(dev)


class MixedPrecision:
    """One rank's autocast and its share of the loss scale every rank moves alike.

    `scaled` (some rank of the job computes in fp16) turns on `torch.amp.GradScaler` on every
    rank with the same settings (`init_scale` and torch's growth and back-off rules);
    otherwise `scale` and `step` are the plain backward and step.
    `last_skipped`: the scaler found Inf/NaN in the all-reduced gradient and skipped the step
    (every rank alike); `MAX_SKIPPED_IN_A_ROW` skips in a row raise `NonFiniteGradient`: a
    scale that keeps falling is a gradient that is NaN whatever the scale.
    """

    def __init__(
        self, device: str, precision: str, scaled: bool, init_scale: float = 2.0**16
    ) -> None:
        self.device, self.precision = device, precision
        self.scaler = torch.amp.GradScaler(
            torch.device(device).type, init_scale=init_scale, enabled=scaled
        )
        self.skips = SkipCount()

    @property
    def last_skipped(self) -> bool:
        return self.skips.last

    def autocast(self):
        return autocast(self.device, self.precision)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """`loss` times the shared scale (itself when no rank computes in fp16)."""
        return self.scaler.scale(loss) if self.scaler.is_enabled() else loss

    def step(self, opt) -> None:
        """The optimizer's step on the unscaled gradient, or none where it holds Inf/NaN."""
        if not self.scaler.is_enabled():
            opt.step()
            return
        before = self.scaler.get_scale()
        self.scaler.step(opt)
        self.scaler.update()
        self.skips.note(
            self.scaler.get_scale() < before,
            lambda n: (
                f"{n} steps in a row skipped with the loss scale down to "
                f"{self.scaler.get_scale():g}: the gradient is NaN/Inf whatever the scale"
            ),
        )

    def state_dict(self) -> dict:
        return self.scaler.state_dict() if self.scaler.is_enabled() else {}

    def load_state_dict(self, state: dict) -> None:
        if state and self.scaler.is_enabled():
            self.scaler.load_state_dict(state)


def rank_device_precision(
    cluster: ClusterSpec,
    train: TrainConfig,
    rank: int,
    local_rank: int,
    backend: str,
    host: HostDevices | None = None,
) -> tuple[str, str]:
    """This rank's device and precision, resolved on its own host (a rank may run on a host
    the launcher never saw); a ConfigError naming the worker where they cannot be had."""
    host = HostDevices.here() if host is None else host
    w = cluster.workers[rank]
    who = f"cluster.workers[{w.name}]"
    device = resolve_device(w.device, local_rank, host, who)
    if backend == "nccl" and device == "cpu":
        raise ConfigError(f"{who}.device: the job runs over NCCL, and this rank has no CUDA device")
    setting = w.precision or train.precision
    return device, resolve_precision(setting, device, host, who if w.precision else "train")
