"""The EC2 catalog against moto's EC2 API over HTTP; prices, emulated instance types, cost."""

from __future__ import annotations

import json

import pytest

from hetflow.infra.catalog import (
    CatalogError,
    network_gbps,
)
from hetflow.infra.pricing import load_prices, price_table


def test_price_table_must_name_its_source_and_date(tmp_path):
    table = load_prices()
    assert table.source and table.as_of and table.prices["g5.xlarge"] > 0
    good = {"source": "somewhere", "as_of": "2024-06-01", "prices": {"g5.xlarge": 1.0}}
    assert price_table(good).price("g5.xlarge") == 1.0
    for broken, expected in [
        ({k: v for k, v in good.items() if k != "source"}, "'source'"),
        ({**good, "as_of": " "}, "'as_of'"),
        ({**good, "prices": {}}, "prices"),
        ({**good, "prices": {"g5.xlarge": -1}}, "prices.g5.xlarge"),
    ]:
        path = tmp_path / "prices.json"
        path.write_text(json.dumps(broken))
        with pytest.raises(CatalogError, match=expected) as e:
            load_prices(path)
        assert len(str(e.value).splitlines()) == 1
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(CatalogError, match="not valid JSON"):
        load_prices(tmp_path / "bad.json")
    with pytest.raises(CatalogError, match="no hourly price"):
        table.price("x9.unpriced")


def test_network_wording():
    assert network_gbps("Up to 10 Gigabit") == 10.0
    assert network_gbps("3200 Gigabit") == 3200.0
    assert network_gbps("High") == 1.0
    with pytest.raises(CatalogError):
        network_gbps("fast")


def test_the_shipped_snapshot_resolves_gpu_families_offline(monkeypatch):
    from hetflow.infra.catalog import load_snapshot, lookup_types

    for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    types = lookup_types(["p3.2xlarge", "g4dn.xlarge", "g5.xlarge", "p4d.24xlarge", "p5.48xlarge"])
    assert types["p3.2xlarge"].gpu_name == "V100" and types["p3.2xlarge"].gpus == 1
    assert types["p4d.24xlarge"].gpus == 8 and types["p5.48xlarge"].gpu_name == "H100"
    families = {k.split(".")[0] for k in load_snapshot()}
    assert {"g4dn", "g5", "g6", "p3", "p4d", "p5"} <= families
    for info in load_snapshot().values():  # every row prices and seeds a plan
        assert info.peak_tflops > 0 and info.network_gbps > 0
    from hetflow.infra.pricing import load_prices

    prices = load_prices()
    assert all(prices.price(t) > 0 for t in ("p3.2xlarge", "g4dn.xlarge", "p5.48xlarge"))


def test_simulate_mixes_a_v100_instance_offline(monkeypatch, capsys):
    from hetflow.cli import main

    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    assert main(["simulate", "--mix", "g4dn.xlarge:32,g5.xlarge:16,p3.2xlarge:16"]) == 0
    assert '"p3.2xlarge": 16' in capsys.readouterr().out
