"""EC2 prices: a table shipped with the project (`infra/prices.json`), which must say where and
when its figures come from, or the AWS Price List API where it is reachable (opt-in: it needs
credentials and the network)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from pydantic import BaseModel

from hetflow.config import ConfigError

PRICE_TABLE = Path(__file__).with_name("prices.json")
DEFAULT_REGION = "us-east-1"


class CatalogError(ConfigError):
    """An instance type the catalog does not know, a bad price table: one line, names the input."""


class PriceTable(BaseModel):
    """Hourly On-Demand prices and where and when they come from."""

    source: str
    as_of: str
    region: str = DEFAULT_REGION
    currency: str = "USD"
    prices: dict[str, float]

    def price(self, instance_type: str) -> float:
        if instance_type not in self.prices:
            raise CatalogError(
                f"{instance_type}: no hourly price in the price table ({self.source}, "
                f"as of {self.as_of}); add it there"
            )
        return self.prices[instance_type]


def read_table(path: str | Path, what: str) -> dict:
    """The JSON object of a shipped or user's table at `path`; a one-line CatalogError naming
    the file and `what` it should be ('price table') when it cannot be read or parsed."""
    p = Path(path)
    try:
        return json.loads(p.read_text())
    except OSError as e:
        raise CatalogError(f"{p}: cannot read the {what} ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise CatalogError(
            f"{p}: the {what} is not valid JSON ({e.msg}, line {e.lineno})"
        ) from None


def load_prices(path: str | Path = PRICE_TABLE) -> PriceTable:
    """Read a price table; it must name its source and date, and hold positive prices."""
    return price_table(read_table(path, "price table"), str(path))


def check_sourced(data, where: str, what: str, body: str) -> None:
    """That a table's parsed JSON is a mapping that says where its figures come from and when
    (non-empty 'source' and 'as_of'); one CatalogError line naming `where` otherwise. `what`:
    'price table'; `body`: the key holding its figures."""
    if not isinstance(data, dict):
        raise CatalogError(f"{where}: expected a mapping with source, as_of and {body}")
    for key in ("source", "as_of"):
        value = data.get(key)
        if not isinstance(value, str) or not value.strip():
            raise CatalogError(
                f"{where}: a {what} must say where its figures come from and when "
                f"('source' and 'as_of'); {key!r} is missing or empty"
            )


def price_table(data: dict, where: str = "price table") -> PriceTable:
    check_sourced(data, where, "price table", "prices")
    prices = data.get("prices")
    if not isinstance(prices, dict) or not prices:
        raise CatalogError(f"{where}: 'prices' must map instance types to hourly prices")
    for name, value in prices.items():
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value < 0
        ):
            raise CatalogError(
                f"{where}: prices.{name} must be a finite number >= 0 (got {value!r})"
            )
    extra = {k: v for k, v in data.items() if k in ("region", "currency")}
    return PriceTable(source=data["source"], as_of=data["as_of"], prices=prices, **extra)
