"""What can be rented, read once for `hetflow recommend` and the `recommend` flow: the offline
catalog's instance types (`catalog.load_snapshot`), their On-Demand prices
(`pricing.load_prices`) and, when spot is searched, the spot table (`spot.load_spot`: the
shipped one or the user's). The forecast room prices mixes from it and reads nothing itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetflow.config import RecommendMarket
from hetflow.infra.catalog import InstanceInfo, load_snapshot
from hetflow.infra.pricing import CatalogError, PriceTable, load_prices
from hetflow.infra.spot import SPOT_TABLE, SpotTable, load_spot


@dataclass(frozen=True)
class RentalMarket:
    """The catalog's types by name, the On-Demand price table, and the spot table (None: spot
    not searched)."""

    types: dict[str, InstanceInfo]
    prices: PriceTable
    spot: SpotTable | None = None


def load_market(market: RecommendMarket | None = None) -> RentalMarket:
    """The shipped catalog and prices, with the spot table `market.spot_table` (default: the
    shipped one) when `market` searches spot; a table that cannot be read or is unsound is one
    line naming its flag, `--spot-table`, as the command's other errors do (a CatalogError)."""
    table = None
    if market is not None and market.spot:
        try:
            table = load_spot(market.spot_table or SPOT_TABLE)
        except CatalogError as e:
            raise CatalogError(f"--spot-table: {e}") from None
    return RentalMarket(load_snapshot(), load_prices(), table)
