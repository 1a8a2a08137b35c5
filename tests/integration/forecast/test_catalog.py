"""The EC2 catalog against moto's EC2 API over HTTP; prices, emulated instance types, cost."""

from __future__ import annotations

import pytest

from hetflow.config import ClusterSpec, ConfigError
from hetflow.figures import RankFigures, RunMetrics
from hetflow.infra.catalog import (
    Catalog,
    CatalogError,
    cost_usd,
    describe_instance_types,
    resolve_cluster,
    seed_profile,
    with_cost,
)

# one instance type per GPU family a user would name (moto 5.2 knows p3dn, not p3.2xlarge)
FAMILIES = {
    "g4dn.xlarge": ("T4", 1, 16384),
    "g5.xlarge": ("A10G", 1, 22888),
    "p3dn.24xlarge": ("V100", 8, 32768),
    "p4d.24xlarge": ("A100", 8, 40960),
    "p5.48xlarge": ("H100", 8, 81920),
}


@pytest.fixture
def catalog(s3):
    return Catalog.from_ec2([*FAMILIES, "c5.xlarge"])


def test_describe_instance_types_answers_for_every_gpu_family(catalog):
    for name, (gpu, count, mem) in FAMILIES.items():
        info = catalog.info(name)
        assert (info.gpu_name, info.gpus, info.gpu_memory_mib) == (gpu, count, mem)
        assert info.vcpus >= 4 and info.memory_mib >= 16384 and info.network_gbps > 0
        assert catalog.price(name) > 0
    cpu = catalog.info("c5.xlarge")
    assert cpu.gpus == 0 and cpu.device == "CPU" and cpu.peak_tflops > 0
    assert catalog.info("p4d.24xlarge").network == "4x 100 Gigabit"
    assert catalog.info("p4d.24xlarge").worker_link_gbps == pytest.approx(400 / 8)


def test_relative_peak_orders_the_families(catalog):
    order = ["g4dn.xlarge", "p3dn.24xlarge", "p4d.24xlarge", "g5.xlarge", "p5.48xlarge"]
    speeds = catalog.relative_peak(order)
    assert speeds == sorted(speeds) and speeds[-1] == 1.0
    assert speeds[0] == pytest.approx(8.1 / 67.0)


def test_unknown_instance_type_is_one_clear_line(s3):
    with pytest.raises(CatalogError) as e:
        describe_instance_types(["g5.xlarge", "g9.enormous"])
    msg = str(e.value)
    assert "g9.enormous" in msg and "g5.xlarge" not in msg and len(msg.splitlines()) == 1
    assert isinstance(e.value, ConfigError)  # the CLI prints it as a one-line error


def test_resolve_cluster_derives_speeds_and_links_from_instance_types(catalog):
    cluster = ClusterSpec.model_validate(
        {
            "name": "rehearsal",
            "workers": [
                {"name": "t4", "instance_type": "g4dn.xlarge"},
                {"name": "a10g", "instance_type": "g5.xlarge"},
                {"name": "v100", "instance_type": "p3dn.24xlarge", "link_gbps": 2.0},
            ],
        }
    )
    resolved = resolve_cluster(cluster, catalog)
    speeds = [w.speed for w in resolved.workers]
    assert speeds == pytest.approx([8.1 / 31.2, 1.0, 15.7 / 31.2], rel=1e-4)
    assert [w.link_gbps for w in resolved.workers] == [5.0, 2.5, 2.0]  # the explicit link stays
    assert resolved.slowdowns()[1] == resolved.time_scale
    assert resolve_cluster(resolved, catalog) == resolved  # idempotent
    assert resolve_cluster(ClusterSpec.from_speeds([1, 2]), catalog).workers[1].speed == 2
    mixed = ClusterSpec.model_validate(
        {"workers": [{"name": "a", "instance_type": "g5.xlarge"}, {"name": "b", "speed": 2}]}
    )
    with pytest.raises(CatalogError, match="every worker or for none"):
        resolve_cluster(mixed, catalog)
    unknown = ClusterSpec.model_validate(
        {
            "workers": [
                {"name": "a", "instance_type": "g5.xlarge"},
                {"name": "b", "instance_type": "zz.top"},
            ]
        }
    )
    with pytest.raises(CatalogError, match="zz.top"):
        Catalog.for_cluster(unknown)


def test_seed_profile_feeds_the_planner(catalog):
    from hetflow.config import TrainConfig
    from hetflow.training.plan.planner import make_plan

    cluster = resolve_cluster(
        ClusterSpec.model_validate(
            {
                "workers": [
                    {"name": "t4", "instance_type": "g4dn.xlarge"},
                    {"name": "h100", "instance_type": "p5.48xlarge"},
                ]
            }
        ),
        catalog,
    )
    plan = make_plan(
        seed_profile(cluster, catalog),
        cluster,
        TrainConfig(global_batch=100, schedule="proportional"),
    )
    assert sum(plan.local_batches) == 100 and plan.local_batches[1] > 7 * plan.local_batches[0]


def test_cost_by_worker_total_and_per_epoch(catalog):
    cluster = ClusterSpec.model_validate(
        {
            "workers": [
                {"name": "a", "instance_type": "g5.xlarge"},
                {"name": "b", "instance_type": "p4d.24xlarge"},
            ]
        }
    )
    cost = cost_usd(cluster, 1800, catalog, epochs=3)
    g5, p4d_share = catalog.price("g5.xlarge"), catalog.price("p4d.24xlarge") / 8
    assert cost["by_worker"] == pytest.approx({"a": g5 / 2, "b": p4d_share / 2})
    assert cost["total_usd"] == pytest.approx((g5 + p4d_share) / 2)
    assert cost["per_epoch_usd"] == pytest.approx(cost["total_usd"] / 3)
    assert "as of" in cost["price_source"]
    local = cost_usd(ClusterSpec.from_speeds([1, 2]), 60, catalog)
    assert local["total_usd"] == 0 and local["unpriced"] == ["w0", "w1"]
    with pytest.raises(CatalogError, match="duration_s"):
        cost_usd(cluster, -1, catalog)


def test_a_runs_metrics_carry_the_cost_of_its_loop_per_rank_and_per_epoch(catalog):
    cluster = ClusterSpec.model_validate(
        {
            "workers": [
                {"name": "a", "instance_type": "g5.xlarge"},
                {"name": "b", "instance_type": "g4dn.xlarge"},
            ]
        }
    )
    ranks = [RankFigures(rank=r, local_batch=32, busy_fraction=0.5) for r in (1, 0)]
    metrics = RunMetrics(steps=100, train_loop_s=3600.0, ranks=ranks)
    out = with_cost(cluster, metrics, 64, catalog, epoch_samples=1600)
    g5, t4 = catalog.price("g5.xlarge"), catalog.price("g4dn.xlarge")
    assert [r.cost_usd for r in out.ranks] == pytest.approx([t4, g5])  # by rank, not by order
    assert out.cost_usd == pytest.approx(g5 + t4)
    assert out.cost_per_epoch_usd == pytest.approx((g5 + t4) / 4)  # 100 x 64 samples: 4 epochs
    assert with_cost(cluster, metrics, 64, None, 1600) is metrics
