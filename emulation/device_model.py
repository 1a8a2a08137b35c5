"""What an emulated device's step costs, step by step: its own curve in the batch, noise at a
named level with slow stretches, stragglers that jump or drift in, and a memory cliff (pure:
no torch, no clock).

The emulator (`hetflow.emulation.emulator.Emulator`) dilates the host's CPU time by these
factors; `EmulatedCluster` gives the same devices' compute times without a host, for tests
that drive the pure re-balancer with devices that no affine model fits by construction.

Where each default comes from (figures and commands: docs/measurements/emulation.md, "Noise,
and devices of their own"):

- Curve: a preset's is its published per-batch latency (`presets`). A worker given only a
  speed takes the published curve of a device of that speed: the presets' shapes
  interpolated in log(speed) between the two nearest presets (speed in thousands of samples/s
  at the best batch, as a preset's), the nearest preset's outside them. Devices of different
  speeds so differ in shape (the fixed cost and the knee of a T4 are not an A100's), and none
  is the host's curve times a scalar. `knee_batch` / `fixed_samples` give a curve of one's own
  instead (`presets.knee_shape`); `knee_batch=1` is the host's curve times the speed alone.
- Noise (`NOISE_LEVELS`): `alone` is a real CPU worker with a core to itself (CV 0.039-0.045,
  0-0.3% of steps paused, no lasting stretches); `shared` is two real workers sharing the
  host (CV 0.14-0.33, 1.3-5.9% paused); about a third of their log step time's variance
  lasts several steps (autocorrelation 0.22-0.39 at lag 1, decaying over 4 to more than 8
  steps), the rest is fresh every step. A pause is PAUSE_FACTOR times its step (2.1-2.4 x the
  median measured).
- Stragglers and the cliff have no default: a test or a bench names them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from hetflow.emulation.presets import PRESETS, knee_shape

# A pause makes a step last this many times its time: the mean length of the pauses
# `hetflow bench noise` saw (2.1-2.4 x the median; docs/measurements/emulation.md).
PAUSE_FACTOR = 2.3

# (rank, step, factor) or (rank, step, factor, ramp): from `step` on, `rank`'s compute lasts
# `factor` times longer, reached over `ramp` steps (0 or absent: at once).
Straggler = tuple[int, int, float] | tuple[int, int, float, int]


@dataclass(frozen=True)
class Noise:
    """Step-to-step noise of an emulated compute step: a log-normal factor of mean 1 and
    coefficient of variation `cv`, times PAUSE_FACTOR on a share `pauses` of steps drawn
    independently. A share `persistent` of the log factor's variance is a slow stretch: an
    AR(1) process whose correlation time is `correlation_steps` (the autocorrelation at lag k
    is persistent x exp(-k / correlation_steps)); the rest is drawn afresh every step."""

    cv: float = 0.0
    pauses: float = 0.0
    correlation_steps: float = 0.0
    persistent: float = 0.0

    def __post_init__(self) -> None:
        if not (
            0 <= self.cv <= 1
            and 0 <= self.pauses <= 0.5
            and self.correlation_steps >= 0
            and 0 <= self.persistent <= 1
        ):
            raise ValueError(f"noise out of range: {self}")

    def autocorrelation(self, lag: int) -> float:
        """The autocorrelation of the log factor at `lag` steps, pauses aside (pure).

        >>> NOISE_LEVELS["alone"].autocorrelation(1), NOISE_LEVELS["shared"].autocorrelation(0)
        (0.0, 1.0)
        """
        if lag == 0:
            return 1.0
        if self.correlation_steps <= 0:
            return 0.0
        return self.persistent * math.exp(-lag / self.correlation_steps)


NOISE_LEVELS: dict[str, Noise] = {
    "none": Noise(),
    # a real CPU worker alone on its core (`hetflow bench noise --ranks 1`, a quiet host)
    "alone": Noise(cv=0.04, pauses=0.003),
    # real workers sharing the host (`hetflow bench noise --ranks 2`): CV and paused share in
    # the middle of those measured; a third of the variance in stretches of about 5 steps
    "shared": Noise(cv=0.2, pauses=0.03, correlation_steps=5.0, persistent=1 / 3),
}


class StepNoise:
    """One device's noise factor at each step, drawn from `seed`: the same seed gives the same
    factor at a step whatever steps were asked for before (the process is generated in step
    order and kept). `next()` is the factor of the step after the last one asked for, for a
    caller that counts phases rather than steps (the emulator).

    >>> a, b = StepNoise(NOISE_LEVELS["shared"], seed=1), StepNoise(NOISE_LEVELS["shared"], 1)
    >>> a.factor(30) == b.factor(30) and a.factor(2) == b.factor(2) and a.factor(30) > 0
    True
    >>> StepNoise(NOISE_LEVELS["none"]).factor(7)
    1.0
    """

    def __init__(self, noise: Noise, seed: int = 0) -> None:
        self.noise = noise
        self._sigma = math.sqrt(math.log1p(noise.cv**2))
        self._rng = random.Random(seed)
        self._slow: float | None = None  # the AR(1)'s last state (stationary at the first step)
        self._factors: list[float] = []

    def factor(self, step: int) -> float:
        """The multiplier on step `step`'s time (mean 1 over the steps, pauses included at
        1 + pauses x (PAUSE_FACTOR - 1))."""
        while len(self._factors) <= step:
            self._factors.append(self._draw())
        return self._factors[step]

    def next(self) -> float:
        """The factor of the step after the last one drawn."""
        return self.factor(len(self._factors))

    def _draw(self) -> float:
        noise, sigma = self.noise, self._sigma
        factor = 1.0
        if sigma:
            rho = math.exp(-1 / noise.correlation_steps) if noise.correlation_steps > 0 else 0.0
            shock = self._rng.gauss(0.0, 1.0)
            if self._slow is None or rho == 0:
                self._slow = shock
            else:
                self._slow = rho * self._slow + math.sqrt(1 - rho**2) * shock
            share = noise.persistent if rho else 0.0
            fresh = self._rng.gauss(0.0, 1.0)
            log = sigma * (math.sqrt(share) * self._slow + math.sqrt(1 - share) * fresh)
            factor = math.exp(log - sigma**2 / 2)
        if noise.pauses and self._rng.random() < noise.pauses:
            factor *= PAUSE_FACTOR
        return factor


def published_shape(speed: float, batch: int) -> float:
    """The step-time shape (per-sample time at `batch` over the best, >= 1) of a device of
    `speed` thousand samples/s: the presets' shapes at `batch` interpolated in log(speed)
    between the two presets nearest in peak speed (geometric mean weighted by distance), the
    nearest preset's beyond them.

    >>> t4, a100 = PRESETS["t4"], PRESETS["a100"]
    >>> published_shape(0.5, 8) == t4.shape(8), published_shape(50, 8) == a100.shape(8)
    (True, True)
    """
    ranked = sorted(PRESETS.values(), key=lambda p: p.peak_samples_per_s)
    at = math.log(speed * 1e3)
    logs = [math.log(p.peak_samples_per_s) for p in ranked]
    if at <= logs[0]:
        return ranked[0].shape(batch)
    if at >= logs[-1]:
        return ranked[-1].shape(batch)
    i = next(i for i in range(1, len(ranked)) if logs[i] >= at)
    t = (at - logs[i - 1]) / (logs[i] - logs[i - 1])
    lo, hi = ranked[i - 1].shape(batch), ranked[i].shape(batch)
    return math.exp((1 - t) * math.log(lo) + t * math.log(hi))


def cliff(batch: int, cliff_batch: int | None, cliff_factor: float) -> float:
    """`cliff_factor` past `cliff_batch` (a step that no longer fits the device's fast memory),
    1 up to it and where there is no cliff.

    >>> cliff(64, 32, 3.0), cliff(32, 32, 3.0), cliff(64, None, 3.0)
    (3.0, 1.0, 1.0)
    """
    return cliff_factor if cliff_batch is not None and batch > cliff_batch else 1.0


@dataclass(frozen=True)
class Device:
    """An emulated device's compute, before noise: `speed` thousand samples/s at its best batch
    (a preset's peak; `WorkerSpec.speed`), the shape of its curve (the preset's, else
    `knee_batch` / `fixed_samples` where either is given, else with `curve` 'published' the
    `published_shape` of its speed, else 1: the host's curve times the speed) and a memory
    cliff."""

    speed: float = 1.0
    preset: str | None = None
    knee_batch: int | None = None
    fixed_samples: float = 0.0
    cliff_batch: int | None = None
    cliff_factor: float = 1.0
    curve: str = "host"  # a device of a speed alone: 'host' (shape 1) or 'published'

    def __post_init__(self) -> None:
        if not (self.speed > 0 and self.cliff_factor >= 1):
            raise ValueError(f"device out of range: {self}")

    def shape(self, batch: int) -> float:
        """How much longer than `batch` / speed a step of `batch` lasts here (>= 1)."""
        if batch <= 0:
            return 1.0
        if self.preset is not None:
            own = PRESETS[self.preset].shape(batch)
        elif self.knee_batch is not None or self.fixed_samples:
            own = knee_shape(batch, self.knee_batch, self.fixed_samples)
        elif self.curve == "published":
            own = published_shape(self.speed, batch)
        else:
            own = 1.0
        return own * cliff(batch, self.cliff_batch, self.cliff_factor)

    def compute_s(self, batch: int) -> float:
        """Seconds of a step of `batch` samples, no noise (0 for none)."""
        return batch * self.shape(batch) / (self.speed * 1e3) if batch > 0 else 0.0


def straggler_factor(stragglers: Sequence[Straggler], rank: int, step: int) -> float:
    """The factor on `rank`'s compute at `step`. Entries for this rank whose onset has come
    apply in the order listed: each moves the factor from what the earlier ones give to its
    own, geometrically over its `ramp` steps (the full factor from onset + ramp on; at once
    where the ramp is 0 or absent); 1.0 before any.

    >>> [straggler_factor([(0, 10, 4.0, 2)], 0, s) for s in (9, 10, 11, 12, 50)]
    [1.0, 1.0, 2.0, 4.0, 4.0]
    >>> straggler_factor([(0, 10, 4.0)], 0, 10), straggler_factor([(0, 10, 4.0)], 1, 10)
    (4.0, 1.0)
    """
    factor = 1.0
    for r, at, f, *ramp in stragglers:
        if r != rank or step < at:
            continue
        steps = ramp[0] if ramp else 0
        done = 1.0 if steps <= 0 else min(1.0, (step - at) / steps)
        factor = factor ** (1 - done) * f**done
    return factor


@dataclass
class EmulatedCluster:
    """Each rank's compute time at each step, for devices `devices` with noise `noise` drawn
    from `seed` (rank r's from seed x 1009 + r, as the emulator seeds its ranks) and
    `stragglers`: a pure stand-in for the emulated ranks (no host curve: a device's step is
    `Device.compute_s`). A rank's time at a step depends on its device, its batch, the step
    and the seed, not on what was asked before.

    >>> devices = [Device(speed=1.5), Device(speed=6.0, cliff_batch=64, cliff_factor=3.0)]
    >>> shared = NOISE_LEVELS["shared"]
    >>> cluster = EmulatedCluster(devices, shared, seed=0, stragglers=[(0, 100, 3.0, 20)])
    >>> window = [cluster.step_times([32, 96], step) for step in range(10)]
    >>> window[5] == EmulatedCluster(devices, shared, seed=0).step_times([32, 96], 5)
    True
    >>> EmulatedCluster(devices).step_times([32, 0], step=5) == [devices[0].compute_s(32), 0.0]
    True
    """

    devices: Sequence[Device]
    noise: Noise = NOISE_LEVELS["none"]
    seed: int = 0
    stragglers: Sequence[Straggler] = ()
    _noise: list[StepNoise] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._noise = [
            StepNoise(self.noise, self.seed * 1009 + r) for r in range(len(self.devices))
        ]

    def step_times(self, plan: Sequence[int], step: int) -> list[float]:
        """Each rank's compute seconds at `step` with local batches `plan` (0 for a rank with
        no samples)."""
        return [
            d.compute_s(b)
            * self._noise[r].factor(step)
            * straggler_factor(self.stragglers, r, step)
            if b > 0
            else 0.0
            for r, (d, b) in enumerate(zip(self.devices, plan, strict=True))
        ]
