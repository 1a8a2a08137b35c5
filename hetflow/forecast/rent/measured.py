"""Step-time curves that measured profiles give `hetflow recommend` (from the profile history;
pure, no I/O: `hetflow.history.store.newest_real` reads the entries, `rental.measured_history`
makes them curves).

A profile fits one device's step as `fit_latency_s + fit_s_per_sample x b` at the job's own
recipe on the type's own hardware (`hetflow.records.RankProfile`), and finds the largest local
batch that fits its memory (`memory_cap_batch`). Recommend takes that line as the type's curve,
up to the cap, in place of a published curve scaled by FLOPs: it is the job's model, measured,
not ResNet-50's inference latencies times 3. Only an entry measured without emulation stands
for a real device (an emulated worker's seconds are the emulator's).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MeasuredCurve:
    """One device of an instance type as its newest fresh profile measured it; `source` says
    which profile (its URL and age)."""

    latency_s: float
    per_sample_s: float
    cap: int | None  # the largest local batch that fits; None: not measured
    source: str

    def steps(self, max_batch: int) -> tuple[float, ...]:
        """Step seconds at b = 1 .. min(max_batch, cap): the fitted line, never below its
        per-sample part (a fit's latency may come out slightly negative).

        >>> MeasuredCurve(0.01, 0.002, 3, "x").steps(10)
        (0.012, 0.014, 0.016)
        """
        top = max_batch if self.cap is None else min(max_batch, self.cap)
        return tuple(
            round(max(self.latency_s + self.per_sample_s * b, self.per_sample_s * b), 12)
            for b in range(1, top + 1)
        )


def curve_of(rank, source: str) -> MeasuredCurve | None:
    """The curve of a profile's `RankProfile` (its fit and memory cap); None where the fit is
    not a curve (no positive per-sample time, or a cap of no sample)."""
    if not rank.fit_s_per_sample > 0 or rank.memory_cap_batch == 0:
        return None
    return MeasuredCurve(rank.fit_latency_s, rank.fit_s_per_sample, rank.memory_cap_batch, source)
