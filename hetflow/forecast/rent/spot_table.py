"""What prices spot instances for `hetflow recommend` and the `recommend` flow: the spot table
(read by the caller: `hetflow.infra.market`), the candidates' per-type overrides, the markets
searched and what an interruption costs (the model: `rent.spot`). Bad input is one line
(a RecommendError) naming its flag, the same in both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hetflow.config import TrainConfig, suggestion
from hetflow.forecast.rent.search import RecommendError
from hetflow.forecast.rent.spot import DEFAULT_RESTART, MARKETS, Restart, deadline_risk

# An interruption redoes half the steps since the last checkpoint: a run's checkpoint interval
CHECKPOINT_EVERY = TrainConfig.model_fields["checkpoint_every"].default


def spot_terms(name: str, usd: float, spot) -> tuple[float, float]:
    """(Spot $/h, interruptions per instance-hour) of one type, or one line: none known."""
    info = spot.types.get(name)
    if info is None:
        raise RecommendError(
            f"--market: {name} has no spot figures in the spot table ({spot.source}, as of "
            f"{spot.as_of}); give them with --spot-discount and --interruptions, or --spot-table"
        )
    return usd * (1 - info.savings), info.per_hour


def _candidates_only(flag: str, values: Mapping[str, float], names) -> None:
    """Each type of a per-type override names a candidate (its value is checked by
    `hetflow.config.SpotOverride`)."""
    for name in values:
        if name not in names:
            raise RecommendError(
                f"{flag}: {name} is not a candidate ({', '.join(names)}){suggestion(name, names)}"
            )


def spot_table(table, known, names: Sequence[str], discounts=None, per_month=None):
    """The spot table `table` (a `hetflow.infra.spot.SpotTable`), every type of it among the
    catalog's `known` types, with the candidates' per-type overrides: `discounts` (savings off
    On-Demand, [0, 1)) and `per_month` (interruptions per instance-month, >= 0). A copy: the
    caller's table is left as it was."""
    discounts, per_month = dict(discounts or {}), dict(per_month or {})
    for name in table.types:
        if name not in known:
            raise RecommendError(
                f"--spot-table: types.{name} is not in the offline catalog "
                f"(infra/instance_types.json){suggestion(name, known)}"
            )
    _candidates_only("--spot-discount", discounts, names)
    _candidates_only("--interruptions", per_month, names)
    types = {name: info.model_dump() for name, info in table.types.items()}
    for name in set(discounts) | set(per_month):
        was = table.types.get(name)
        if was is None and not (name in discounts and name in per_month):
            flag = "--interruptions" if name in discounts else "--spot-discount"
            raise RecommendError(f"{flag}: {name} is not in the spot table: give it too")
        savings = discounts.get(name, was.savings if was else 0.0)
        rate = per_month.get(name, was.per_month if was else 0.0)
        bucket = was.bucket if was and name not in per_month else None
        types[name] = {"savings": savings, "per_month": rate, "bucket": bucket}
    if not (discounts or per_month):
        return table
    source = f"{table.source}; overridden for {', '.join(sorted(set(discounts) | set(per_month)))}"
    return table.model_validate({**table.model_dump(), "source": source, "types": types})


def market_terms(kind: str, restart_s: float | None = None, checkpoint_every: int | None = None):
    """(The markets searched for `kind`: 'on-demand', 'spot' or 'both'; the Restart of an
    interruption, the defaults where not given). The values are `RecommendMarket`'s, checked
    there."""
    markets = {"on-demand": ("on-demand",), "spot": ("spot",), "both": MARKETS}[kind]
    restart = Restart(
        DEFAULT_RESTART.restart_s if restart_s is None else float(restart_s),
        CHECKPOINT_EVERY if checkpoint_every is None else int(checkpoint_every),
    )
    return markets, restart


def market_setup(
    kind: str,
    names: Sequence[str],
    market,
    discounts=None,
    per_month=None,
    restart_s: float | None = None,
    checkpoint_every: int | None = None,
):
    """(Markets searched, Restart, SpotTable or None: on-demand only) of a `RecommendMarket`'s
    values on `market` (`hetflow.infra.market.RentalMarket`: its spot table read when spot is
    searched), the per-type overrides applied (`spot_table`)."""
    markets, restart = market_terms(kind, restart_s, checkpoint_every)
    if "spot" not in markets:
        return markets, restart, None
    return markets, restart, spot_table(market.spot, market.types, names, discounts, per_month)


def restart_line(rec) -> str:
    """What one interruption costs the chosen mix, and where the figures come from."""
    r = rec.restart
    redone = min(r.checkpoint_every, rec.job.steps) / 2
    lost = r.lost_s(rec.best.step_s, rec.job.steps)
    source = (
        "as measured here by benchmarks/restart.py, no instance boot counted; --restart-s"
        if r.restart_s == DEFAULT_RESTART.restart_s
        else "--restart-s"
    )
    return (
        f"an interruption costs {r.restart_s:g} s of restart ({source}) + {redone:g} steps "
        f"redone (half of --checkpoint-every {r.checkpoint_every}): {lost:.3g} s on the chosen mix"
    )


def spot_notes(rec) -> list[str]:
    """Where spot's expectations hide a risk: the chosen spot mix's chance to miss the
    deadline, and a cheaper spot mix that meets it only without interruptions."""
    obj, best, cands, notes = rec.objective, rec.best, rec.cands, []
    if obj.kind != "deadline" or "spot" not in rec.markets:
        return notes
    if best.market == "spot":
        per_hour = best.interruptions / best.hours
        lost = rec.restart.lost_s(best.step_s, rec.job.steps)
        k, p = deadline_risk(best.bare_hours, per_hour, lost, obj.deadline_h)
        notes.append(
            f"on spot, {best.hours:.3g} h is an expectation ({best.interruptions:.2g} "
            f"interruptions): {k} interruptions would pass the {obj.deadline_h:g} h deadline, "
            f"a chance of {'under 0.1%' if p < 1e-3 else f'about {p:.1%}'} (Poisson)"
        )
    late = [
        p
        for p in rec.ranked
        if p.market == "spot" and p.cost_usd < best.cost_usd and not obj.feasible(p)
        if p.bare_hours <= obj.planned_h
    ]
    if late:
        p = min(late, key=lambda p: p.cost_usd)
        notes.append(
            f"{p.label(cands)} would meet the deadline less its margin only without "
            f"interruptions ({p.bare_hours:.3g} h; expected {p.hours:.3g} h with "
            f"{p.interruptions:.2g}) for ${p.cost_usd:,.2f}"
        )
    return notes
