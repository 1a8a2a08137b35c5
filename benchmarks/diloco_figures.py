"""`hetflow bench diloco`'s figures over its runs (pure): per link and variant, the time to the
target's median with its min-max, the speed-up over `sync` paired within a seed and round, and
the final quality per seed, its median and spread across seeds, and its change against
`sync`'s of the same seed.

A run is `diloco.one_run`'s figures with its `gbps`, `round`, `seed` and `position` (0: it ran
first in its round). The comparison row is `sync` (DDP at the fixed `--sync-compression`),
else `sync@none`.
"""

from __future__ import annotations

from hetflow.repeats import median_spread, with_medians

TO_TARGET = "end_to_end_time_to_target_s"
SPREAD = ("bytes_per_sample", "wait_fraction", "trials_s", "end_to_end_s")


def quality(runs: list[dict]) -> tuple[str, str]:
    """The final figure the runs have, and its format: val_loss (a token recipe's), else
    accuracy."""
    if any(r.get("final_val_loss") is not None for r in runs):
        return "final_val_loss", ".4f"
    return "final_accuracy", ".3f"


def by_seed(runs: list[dict], key: str) -> dict[int, float | None]:
    """Each seed's `key`: the median over that seed's rounds, in seed order."""
    seeds: dict[int, list] = {}
    for r in runs:
        seeds.setdefault(r["seed"], []).append(r.get(key))
    return {s: median_spread(v)[0] for s, v in sorted(seeds.items())}


def summarize_variant(runs: list[dict], sync: list[dict] | None, key: str) -> dict:
    """One variant's row on one link against `sync`'s runs on it (None: no sync ran)."""
    times = [r[TO_TARGET] for r in runs]
    out: dict = {"runs": len(runs), "reached": sum(t is not None for t in times)}
    out[TO_TARGET], out[f"{TO_TARGET}_range"] = median_spread(times)
    paired = {(r["round"], r["seed"]): r[TO_TARGET] for r in sync or []}
    ups = [
        paired[(r["round"], r["seed"])] / r[TO_TARGET]
        for r in runs
        if r[TO_TARGET] and paired.get((r["round"], r["seed"]))
    ]
    out["speedup_vs_sync"], out["speedup_vs_sync_range"] = median_spread(ups)
    out |= quality_against(runs, sync, key, "quality_change_vs_sync")
    if any(r.get("final_test_loss") is not None for r in runs):  # a classifier's, finer
        out |= quality_against(runs, sync, "final_test_loss", "test_loss_change_vs_sync")
    out = with_medians(out, runs, SPREAD)
    sync_bytes = median_spread(r["bytes_per_sample"] for r in sync or [])[0]
    b = out.get("bytes_per_sample")
    out["bytes_vs_sync"] = b / sync_bytes if b is not None and sync_bytes else None
    return out


def quality_against(runs: list[dict], sync: list[dict] | None, key: str, change: str) -> dict:
    """`key`'s median over the seeds (each seed's median over its rounds) with its range and
    each seed's, and its relative change against `sync`'s same seed (`change`)."""
    seeds = by_seed(runs, key)
    out: dict = {}
    out[key], out[f"{key}_range"] = median_spread(seeds.values())
    out[f"{key}_by_seed"] = list(seeds.values())
    base = by_seed(sync or [], key)
    changes = [
        (q - base[s]) / abs(base[s]) for s, q in seeds.items() if q is not None and base.get(s)
    ]
    out[change], out[f"{change}_range"] = median_spread(changes)
    return out


def summarize_links(rows: dict[float, dict[str, list[dict]]]) -> dict[float, dict[str, dict]]:
    """Every link's variants (`summarize_variant`), each against that link's `sync` (else
    `sync@none`)."""
    key, _ = quality([r for v in rows.values() for runs in v.values() for r in runs])
    out = {}
    for gbps, variants in rows.items():
        sync = variants.get("sync") or variants.get("sync@none")
        out[gbps] = {name: summarize_variant(runs, sync, key) for name, runs in variants.items()}
    return out


def spread(row: dict, name: str, fmt: str, unit: str = "") -> str:
    """`row[name]` as text with its min-max after it where they differ as shown (`a to b` for
    signed figures); '-' for none."""
    v, r = row.get(name), row.get(f"{name}_range")
    if v is None:
        return "-"
    text = f"{v:{fmt}}{unit}"
    low, high = (f"{x:{fmt}}" for x in r) if r else ("", "")
    return text + (f" ({low}{' to ' if '+' in fmt else '-'}{high})" if low != high else "")


def table(summary: dict[float, dict[str, dict]]) -> str:
    """The markdown table: per link and variant, medians with their min-max (the quality's
    across seeds), against sync."""
    rows = [r for v in summary.values() for r in v.values()]
    key, fmt = quality([{"final_val_loss": r.get("final_val_loss")} for r in rows])
    loss = any(r.get("final_test_loss") is not None for r in rows)  # a classifier's, finer
    extra = " test loss (across seeds) | vs sync |" if loss else ""
    out = [
        f"| link | variant | to target (s) | speed-up vs sync | {key.replace('final_', 'final ')} "
        f"(across seeds) | vs sync |{extra} bytes/sample | bytes vs sync | waiting | reached |",
        "| --- " * (12 if loss else 10) + "|",
    ]
    for gbps, variants in summary.items():
        for name, r in variants.items():
            t = spread(r, TO_TARGET, ".1f") if r[TO_TARGET] is not None else "not reached"
            b, less = r.get("bytes_per_sample"), r.get("bytes_vs_sync")
            cells = [
                f"{gbps:g} Gbit/s",
                name,
                t,
                spread(r, "speedup_vs_sync", ".2f", "x"),
                spread(r, key, fmt),
                spread(r, "quality_change_vs_sync", "+.2%"),
                *(
                    [
                        spread(r, "final_test_loss", ".4f"),
                        spread(r, "test_loss_change_vs_sync", "+.2%"),
                    ]
                    if loss
                    else []
                ),
                "-" if b is None else f"{b:,.0f}",
                "-" if less is None else f"{less:.3f}",
                spread(r, "wait_fraction", ".2f"),
                f"{r['reached']}/{r['runs']}",
            ]
            out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def progress_line(gbps: float, name: str, round_: int, fig: dict) -> str:
    """One run's line as it ends: its seed and place in its round, its time to the target, or
    'not reached'."""
    t = fig[TO_TARGET]
    reached = "not reached" if t is None else f"{t:.1f} s"
    key, fmt = quality([fig])
    return (
        f"{gbps:g} Gbit/s {name} #{round_} seed {fig['seed']} (ran #{fig['position'] + 1}): "
        f"to target {reached}, {key.removeprefix('final_')} {fig[key]:{fmt}}, "
        f"bytes/sample {fig['bytes_per_sample']:.0f}"
    )
