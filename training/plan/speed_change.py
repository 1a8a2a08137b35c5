"""Telling a change of a worker's speed from the host's noise (pure): how far a rank's window
means and single steps lie from its curve (`host_noise`), the ratio beyond which a change is
one of speed (`jump_of`), and a jump seen over a few steps in a row (`sudden`).

A host shared by several workers runs slow for a few steps at a time (docs/measurements/
emulation.md: about a third of the step time's variance lasts several steps), which a
window's own spread does not show: the noise here is measured against each rank's point at
its batch, the mean of many earlier steps, slow stretches and pauses included.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

# A change beyond this many standard deviations of the measured noise is one of speed: under
# the shared host's noise (CV 0.2 with slow stretches) three were exceeded about twice a run
# on six ranks; four keep a 3x straggler plain and the host's stretches not.
JUMP_SIGMAS = 4.0


def jump_of(threshold: float, sigma: float) -> float:
    """The ratio beyond which a time moved by a change of speed: 1 + 3 x `threshold`, or
    JUMP_SIGMAS standard deviations of log noise `sigma`, whichever is wider.

    >>> jump_of(0.1, 0.0), round(jump_of(0.1, 0.2), 3)
    (1.3, 2.226)
    """
    return max(1 + 3 * threshold, math.exp(JUMP_SIGMAS * sigma))


def host_noise(
    points: Sequence[dict[int, float]],
    plan: Sequence[int],
    means: Sequence[float],
    samples: Sequence[Sequence[float]],
    jump: float,
) -> tuple[float | None, float | None]:
    """The root mean square of the log ratios of each computing rank's window mean (first)
    and single steps (second) to its point at its batch; None where no rank has a point there.
    A rank whose window lies beyond `jump` changed speed: not noise, left out. A single step
    beyond `jump` is a pause (a page fault, the host's other work), which `sudden`'s steps in
    a row already tell from a change of speed: counted in the step noise, one such step among
    a few would raise the bar a real change must pass past any change.

    >>> host_noise([{8: 0.1}], [8], [0.1], [[0.1], [0.1]], 1.3)
    (0.0, 0.0)
    >>> host_noise([{8: 0.1}], [8], [0.1], [[0.1], [0.9], [0.1]], 1.3)
    (0.0, 0.0)
    """
    window, steps = [], []
    for i, b in enumerate(plan):
        point = points[i].get(b) if b and i < len(points) else None
        if not point or not 1 / jump <= means[i] / point <= jump:
            continue
        window.append(math.log(means[i] / point) ** 2)
        steps += [
            math.log(row[i] / point) ** 2
            for row in samples
            if row[i] > 0 and 1 / jump <= row[i] / point <= jump
        ]
    rms = [math.sqrt(sum(x) / len(x)) if x else None for x in (window, steps)]
    return rms[0], rms[1]


def sudden(
    rows: Sequence[Sequence[float]],
    plan: Sequence[int] | None,
    jump: float,
    recent: int,
    reference: int = 3,
) -> bool:
    """Whether a rank's compute time in each of the last `recent` rows lies more than `jump`
    times above, or each more than that below, its median over the `reference` or more rows
    before them (`rows[step][rank]`, every row under the same `plan`). A rank the plan leaves
    out (batch 0) is not looked at: its empty step's time is noise, not speed.

    >>> sudden([[0.1, 0.1]] * 3 + [[0.1, 0.5]] * 3, [8, 8], 1.3, 3)
    True
    >>> sudden([[0.1, 0.1]] * 3 + [[0.1, 0.5]] * 2 + [[0.1, 0.1]], [8, 8], 1.3, 3)
    False
    """
    return jumps(rows, plan, jump, recent, reference) is not None


def jumps(
    rows: Sequence[Sequence[float]],
    plan: Sequence[int] | None,
    jump: float,
    recent: int,
    reference: int = 3,
) -> list[float] | None:
    """Each rank's change of speed where one has jumped (`sudden`): the median of its last
    `recent` rows over the median of those before, for a rank whose every recent row lies
    beyond `jump`; 1.0 for the others. None where no rank jumped.

    >>> jumps([[0.1, 0.1]] * 3 + [[0.1, 0.5]] * 3, [8, 8], 1.3, 3)
    [1.0, 5.0]
    """
    if len(rows) < recent + reference:
        return None
    out = []
    for rank in range(len(rows[0])):
        median = statistics.median(row[rank] for row in rows[:-recent])
        last = [row[rank] for row in rows[-recent:]]
        jumped = (plan is None or plan[rank] != 0) and median > 0
        jumped = jumped and (min(last) > median * jump or max(last) * jump < median)
        out.append(statistics.median(last) / median if jumped else 1.0)
    return out if any(f != 1.0 for f in out) else None


def scaled(
    points: dict[int, float], counts: dict[int, int], factor: float, rows: int, drop: int | None
) -> tuple[dict[int, float], dict[int, int]]:
    """A rank's points and row counts after its speed changed by `factor`: slower (or faster)
    at every batch alike, each point scaled and worth no more than `rows` rows until measured
    again; the point at batch `drop` (the one that showed the change) left out."""
    return (
        {b: t * factor for b, t in points.items() if b != drop},
        {b: min(n, rows) for b, n in counts.items() if b != drop},
    )
