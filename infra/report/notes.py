"""What the comparison table's figures do not say, one sentence each, printed under it: the
workers a run went without and why, and why communication's share grew (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hetflow.infra.report.table import byte_size, fmt, rank_of


def workers_left(
    excluded: Sequence[str], dropped: Sequence[str], went_without: Mapping[str, str]
) -> dict[str, str]:
    """Worker -> what became of it, for `notes`: the plan's `dropped` were not launched, its
    other `excluded` ("NAME: why") ran at batch 0 in the all-reduce, `went_without` (name ->
    why: `Recovery.left_out`) were lost during the run.

    >>> workers_left(["w1: too slow", "w2: too slow"], ["w1"], {"w3": "node lost"})
    {'w1': 'not launched: too slow', 'w2': 'at batch 0 from the start, kept in the all-reduce: \
too slow', 'w3': 'lost during the run: node lost'}
    """
    why = dict(e.split(": ", 1) if ": " in e else (e, "") for e in excluded)
    out = {}
    for name, reason in why.items():
        what = (
            "not launched"
            if name in dropped
            else ("at batch 0 from the start, kept in the all-reduce")
        )
        out[name] = f"{what}: {reason}" if reason else what
    for name in dropped:
        out.setdefault(name, "not launched")
    for name, reason in went_without.items():
        out[name] = f"lost during the run: {reason}"
    return out


def notes(
    baseline: Mapping[str, float],
    optimized: Mapping[str, float],
    left: Mapping[str, Mapping[str, str]] | None = None,
    names: tuple[str, str] = ("baseline", "optimized"),
) -> list[str]:
    """What the table's figures do not say, one sentence each: the workers a run ran without
    (`left`: its name in `names` -> `workers_left`; else the workers at batch 0 at its last
    step), with a warning where that left one worker, which paid no all-reduce; and, where the
    share of communication grew from the first run to the second, why (`_comm_note`). Both
    runs' full figures."""
    out = []
    for name, m in zip(names, (baseline, optimized), strict=True):
        ranks = sorted({r for k in m if (r := rank_of(k)) is not None})
        if left is not None:
            gone = dict(left.get(name) or {})
        else:
            gone = {
                f"rank{r}": "at batch 0 at the last step"
                for r in ranks
                if m.get(f"rank{r}/local_batch") == 0
            }
        if not gone:
            continue
        n = len(ranks) or len(gone)
        who = "; ".join(f"{w} {why}" for w, why in gone.items())
        text = f"{name} ran without {len(gone)} of its {n} workers: {who}."
        other = optimized if m is baseline else baseline
        if m.get("comm_bytes_total") == 0 and (other.get("comm_bytes_total") or 0) > 0:
            working = sum(bool(v) for k, v in other.items() if k.endswith("/local_batch"))
            text += (
                " On the one worker left it sent no gradients (no all-reduce): its changes "
                f"compare one worker's run with {working} workers' sharing each step, not the "
                "same work split better."
            )
        out.append(text)
    comm = _comm_note(baseline, optimized)
    return out + ([comm] if comm else [])


COMM_NOTE_PP = 0.005  # comm_fraction's rise (0.5 pp) from which `notes` says why


def _comm_note(baseline: Mapping[str, float], optimized: Mapping[str, float]) -> str | None:
    """Why comm_fraction rose in the optimized run: each step's communication (per worker) and
    the step, both variants; None where it did not rise or the figures are missing.

    >>> base = {"comm_fraction": 0.09, "train_loop_s": 34.0, "steps": 200}
    >>> note = _comm_note(base, {**base, "comm_fraction": 0.134, "train_loop_s": 20.0})
    >>> note.startswith("comm_fraction rose from 9.0% to 13.4%"), "took no longer" in note
    (True, True)
    """
    need = ("comm_fraction", "train_loop_s", "steps")
    if any(m.get(k) is None for m in (baseline, optimized) for k in need):
        return None
    a, b = baseline["comm_fraction"], optimized["comm_fraction"]
    if b - a < COMM_NOTE_PP or not (baseline["steps"] and optimized["steps"]):
        return None
    step_a, step_b = (m["train_loop_s"] / m["steps"] for m in (baseline, optimized))
    comm_a, comm_b = a * step_a, b * step_b
    rose = f"comm_fraction rose from {fmt(a, 'comm_fraction')} to {fmt(b, 'comm_fraction')}"
    steps = f"{_ms(step_a)} to {_ms(step_b)}"
    if comm_b <= comm_a * 1.1:
        return (
            f"{rose} although each step's communication took no longer ({_ms(comm_a)} to "
            f"{_ms(comm_b)} per worker): the steps got shorter ({steps}), the workers waiting "
            "less for the slowest, so the same all-reduce is a larger share of each step."
        )
    sent = ""
    if baseline.get("comm_bytes_per_step") is not None:
        sent = (
            f"; {byte_size(baseline['comm_bytes_per_step'])} to "
            f"{byte_size(optimized.get('comm_bytes_per_step') or 0.0)} sent per step"
        )
    return (
        f"{rose}: each step's communication took longer ({_ms(comm_a)} to {_ms(comm_b)} per "
        f"worker{sent}), while the steps took {steps}."
    )


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"
