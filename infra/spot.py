"""Spot prices and interruption rates per instance type: a table shipped with the project
(`infra/spot.json`), which must say where and when its figures come from, or one of the
user's in the same format (`hetflow recommend --spot-table PATH`).

Each type has `savings`, the spot price's discount off the On-Demand price (0 <= s < 1), and
`interruption`, the share of its spot instances AWS reclaims in a month: a bucket name of the
table's `buckets` (the Spot Instance Advisor's "<5%", "5-10%", ...) or a number. A month is
`HOURS_PER_MONTH` hours; the rate is taken as even over it (a Poisson process per instance).

    >>> t = spot_table({"source": "s", "as_of": "d", "buckets": {"<5%": 0.025},
    ...                 "types": {"g4dn.xlarge": {"savings": 0.7, "interruption": "<5%"}}})
    >>> t.types["g4dn.xlarge"].per_month, round(t.types["g4dn.xlarge"].per_hour * 1e6, 1)
    (0.025, 34.2)
"""

from __future__ import annotations

import math
from pathlib import Path

from pydantic import BaseModel

from hetflow.infra.pricing import CatalogError, check_sourced, read_table

SPOT_TABLE = Path(__file__).with_name("spot.json")
HOURS_PER_MONTH = 730.0  # 365 x 24 / 12


class SpotInfo(BaseModel):
    """One type's spot figures: discount off On-Demand, interruptions per instance-month."""

    savings: float
    per_month: float
    bucket: str | None = None  # the advisor's bucket it was read from, if any

    @property
    def per_hour(self) -> float:
        """Expected interruptions per instance-hour."""
        return self.per_month / HOURS_PER_MONTH


class SpotTable(BaseModel):
    """Spot figures per instance type and where and when they come from."""

    source: str
    as_of: str
    region: str = "us-east-1"
    types: dict[str, SpotInfo]


def load_spot(path: str | Path = SPOT_TABLE) -> SpotTable:
    """Read a spot table; it must name its source and date and hold sound figures."""
    return spot_table(read_table(path, "spot table"), str(path))


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _info(name: str, entry, buckets: dict, where: str) -> SpotInfo:
    if not isinstance(entry, dict):
        raise CatalogError(f"{where}: types.{name} must map 'savings' and 'interruption'")
    savings, rate = entry.get("savings"), entry.get("interruption")
    if not _number(savings) or not 0 <= savings < 1:
        raise CatalogError(
            f"{where}: types.{name}.savings must be a discount off On-Demand in [0, 1) "
            f"(got {savings!r})"
        )
    if isinstance(rate, str):
        if rate not in buckets:
            raise CatalogError(
                f"{where}: types.{name}.interruption {rate!r} is not a bucket of the table "
                f"({', '.join(buckets) or 'none given'})"
            )
        return SpotInfo(savings=savings, per_month=buckets[rate], bucket=rate)
    if not _number(rate) or rate < 0:
        raise CatalogError(
            f"{where}: types.{name}.interruption must be a bucket name or interruptions per "
            f"instance-month >= 0 (got {rate!r})"
        )
    return SpotInfo(savings=savings, per_month=rate)


def spot_table(data, where: str = "spot table") -> SpotTable:
    """A SpotTable from parsed JSON, or one line naming the first bad field."""
    check_sourced(data, where, "spot table", "types")
    buckets = data.get("buckets", {})
    if not isinstance(buckets, dict):
        raise CatalogError(f"{where}: 'buckets' must map bucket names to interruptions a month")
    for name, value in buckets.items():
        if not _number(value) or value < 0:
            raise CatalogError(f"{where}: buckets.{name} must be a number >= 0 (got {value!r})")
    types = data.get("types")
    if not isinstance(types, dict) or not types:
        raise CatalogError(f"{where}: 'types' must map instance types to their spot figures")
    infos = {name: _info(name, entry, buckets, where) for name, entry in types.items()}
    extra = {"region": data["region"]} if isinstance(data.get("region"), str) else {}
    return SpotTable(source=data["source"], as_of=data["as_of"], types=infos, **extra)
