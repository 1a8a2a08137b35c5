"""`hetflow cluster config`: a Ray cluster-launcher YAML for AWS, checked by Ray's own schema."""

from __future__ import annotations

import pytest
import yaml

from hetflow.cli import main
from hetflow.config import ClusterSpec, ConfigError, WorkerSpec
from hetflow.infra.catalog import Catalog
from hetflow.infra.ray_cluster import NODE_LABEL, ray_cluster_config, validate
from hetflow.training.launch.ray_train import NODE_LABEL as PLACED_BY

pytest.importorskip("ray")

MIX = "name: mix\nlauncher: ray\nworkers:\n" + "".join(
    f"  - {{name: {n}, instance_type: {t}}}\n"
    for n, t in [("a", "g5.xlarge"), ("b", "g5.xlarge"), ("c", "g4dn.12xlarge")]
    + [(f"t{i}", "g4dn.12xlarge") for i in range(4)]
)


def test_one_node_type_per_instance_type_labelled_as_the_launcher_places(tmp_path, monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    (tmp_path / "mix.yaml").write_text(MIX)
    out = tmp_path / "ray-up.yaml"
    assert main(["cluster", "config", str(tmp_path / "mix.yaml"), "-o", str(out)]) == 0
    config = yaml.safe_load(out.read_text())
    types = config["available_node_types"]
    assert set(types) == {"head", "g5_xlarge", "g4dn_12xlarge"}
    assert types["g5_xlarge"]["min_workers"] == types["g5_xlarge"]["max_workers"] == 2
    # 5 workers of one GPU each on instances of 4 GPUs: 2 nodes
    assert types["g4dn_12xlarge"]["max_workers"] == 2
    assert types["g4dn_12xlarge"]["resources"] == {"CPU": 48, "GPU": 4}
    assert types["g5_xlarge"]["labels"] == {PLACED_BY: "g5.xlarge"} and NODE_LABEL == PLACED_BY
    assert types["head"]["resources"] == {"CPU": 0}
    assert any("[gpu,ray]" in c for c in config["setup_commands"])
    validate(config)  # what `ray up` checks, again on the file as written


def test_rays_schema_catches_what_ray_up_would_refuse():
    cluster = ClusterSpec(workers=[WorkerSpec(name="a", instance_type="g5.xlarge")])
    config = ray_cluster_config(cluster, Catalog.for_cluster(cluster), ".")
    config["available_node_types"]["g5_xlarge"]["resources"]["GPU"] = "one"
    with pytest.raises(Exception, match="is not of type 'integer'"):
        validate(config)


def test_a_worker_without_an_instance_type_is_one_line():
    cluster = ClusterSpec(workers=[WorkerSpec(name="a"), WorkerSpec(name="b")])
    with pytest.raises(ConfigError, match=r"^cluster\.workers\[a\]\.instance_type: a cloud"):
        ray_cluster_config(cluster, Catalog.for_cluster(cluster), ".")


def test_a_spot_cluster_asks_ec2_for_spot_worker_nodes_and_keeps_its_head(tmp_path):
    (tmp_path / "spot.yaml").write_text(
        MIX.replace("launcher: ray\n", "launcher: ray\nmarket: spot\n")
    )
    out = tmp_path / "ray-up.yaml"
    assert main(["cluster", "config", str(tmp_path / "spot.yaml"), "-o", str(out)]) == 0
    types = yaml.safe_load(out.read_text())["available_node_types"]
    spot = {"MarketType": "spot"}
    assert types["g5_xlarge"]["node_config"]["InstanceMarketOptions"] == spot
    assert types["g4dn_12xlarge"]["node_config"]["InstanceMarketOptions"] == spot
    assert "InstanceMarketOptions" not in types["head"]["node_config"]  # never interrupted
    on_demand = ray_cluster_config(
        ClusterSpec.from_file(tmp_path / "spot.yaml").model_copy(update={"market": "on-demand"}),
        Catalog.for_types(["g5.xlarge", "g4dn.12xlarge"]),
        ".",
    )
    assert not any(
        "InstanceMarketOptions" in t["node_config"]
        for t in on_demand["available_node_types"].values()
    )


def test_a_market_the_cluster_file_cannot_rent_in_is_one_line_naming_it(tmp_path, capsys):
    (tmp_path / "bad.yaml").write_text(MIX.replace("launcher: ray\n", "market: reserved\n"))
    assert main(["cluster", "config", str(tmp_path / "bad.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "market: Input should be 'on-demand' or 'spot'" in err
