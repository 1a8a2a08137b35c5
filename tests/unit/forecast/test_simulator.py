"""The scale simulator (pure): formulas, invariants, the published tables, bad input."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetflow.config import ConfigError
from hetflow.forecast import simulate as sim
from hetflow.forecast.simulate import published
from hetflow.infra.catalog import Catalog, InstanceInfo
from hetflow.infra.pricing import PriceTable
from hetflow.records import Profile
from hetflow.training.plan.balance import balance_batches

RESNET = sim.MODELS["resnet50"]


def catalog() -> Catalog:
    """A catalog as describe_instance_types reports these types (no endpoint needed)."""
    types = {
        "g4dn.xlarge": InstanceInfo(
            instance_type="g4dn.xlarge",
            vcpus=4,
            cores=2,
            memory_mib=16384,
            gpus=1,
            gpu_name="T4",
            gpu_memory_mib=15360,
            network="Up to 25 Gigabit",
            network_gbps=5.0,
        ),
        "g5.xlarge": InstanceInfo(
            instance_type="g5.xlarge",
            vcpus=4,
            cores=2,
            memory_mib=16384,
            gpus=1,
            gpu_name="A10G",
            gpu_memory_mib=22888,
            network="Up to 10 Gigabit",
            network_gbps=2.5,
        ),
        "p3dn.24xlarge": InstanceInfo(
            instance_type="p3dn.24xlarge",
            vcpus=96,
            cores=48,
            memory_mib=786432,
            gpus=8,
            gpu_name="V100",
            gpu_memory_mib=32768,
            network="100 Gigabit",
            network_gbps=100.0,
        ),
    }
    prices = PriceTable(
        source="test",
        as_of="2024-06-01",
        prices={"g4dn.xlarge": 0.526, "g5.xlarge": 1.006, "p3dn.24xlarge": 31.212},
    )
    return Catalog(types=types, prices=prices)


def homogeneous(
    n: int, link_gbps: float = 10.0, a: float = 0.0, c: float = 0.01
) -> list[sim.WorkerModel]:
    return [sim.WorkerModel(f"w{i}", a, c, link_gbps=link_gbps, node=f"n{i}") for i in range(n)]


# -- communication ----------------------------------------------------------------------------


def test_ring_formula_by_hand():
    # 2(n-1) alpha + 2(n-1)/n x bytes x beta, n = 4, 100 MB at 10 Gbit/s, alpha 50 us
    t = sim.ring_allreduce_time(100e6, 4, 50e-6, 10.0)
    assert t == pytest.approx(6 * 50e-6 + 1.5 * 100e6 * 8 / 10e9)
    assert sim.ring_allreduce_time(100e6, 1, 50e-6, 10.0) == 0.0
    assert sim.ring_allreduce_time(100e6, 4, 50e-6, 10.0, collectives=3) == pytest.approx(
        t + 2 * 6 * 50e-6
    )


def test_ring_bytes_agree_with_the_byte_accounting():
    from hetflow.training.comm import ring_allreduce_bytes

    for n in (2, 3, 8, 1024):
        beta_time = sim.ring_allreduce_time(1e6, n, 0.0, 8e-3)  # 1 byte/us: time in s = bytes / 1e6
        assert beta_time == pytest.approx(ring_allreduce_bytes(1_000_000, n) / 1e6)


def test_allreduce_uses_buckets_slowest_link_and_compression():
    net = sim.Network(alpha_s=10e-6)
    grad = 102.4e6
    k = net.buckets(grad)
    assert k == 1 + math.ceil((grad - sim.MIB) / (25 * sim.MIB))  # DDP: 1 MiB first, then 25 MiB
    workers = homogeneous(8, link_gbps=25.0)
    assert sim.allreduce_time(workers, grad, net) == pytest.approx(
        sim.ring_allreduce_time(grad, 8, 10e-6, 25.0, k)
    )
    slow = [*workers[:-1], replace(workers[-1], link_gbps=5.0)]
    assert sim.allreduce_time(slow, grad, net) == pytest.approx(
        sim.ring_allreduce_time(grad, 8, 10e-6, 5.0, k)
    )
    half = replace(net, compression_ratio=2.0)
    assert sim.allreduce_time(workers, grad, half) == pytest.approx(
        sim.ring_allreduce_time(grad / 2, 8, 10e-6, 25.0, half.buckets(grad / 2))
    )


def test_hierarchical_beats_a_flat_ring_across_nvlink_nodes():
    cat = catalog()
    ws = sim.catalog_cluster([("p3dn.24xlarge", 8)], cat, RESNET, 0.3)  # 64 V100s in 8 nodes
    assert len(ws) == 64 and len({w.node for w in ws}) == 8
    ring = sim.allreduce_time(ws, RESNET.grad_bytes, sim.Network(collective="ring"))
    hier = sim.allreduce_time(ws, RESNET.grad_bytes, sim.Network(collective="hierarchical"))
    assert 0 < hier < ring
    # by hand: intra 2(g-1) x alpha_intra x k + 2(g-1)/g x M / NVLink;
    # inter ring of 8 nodes on 100 Gbit/s
    net, k, m = sim.Network(), sim.Network().buckets(RESNET.grad_bytes), RESNET.grad_bytes
    intra = k * 14 * net.intra_alpha_s + 14 / 8 * m * 8 / (sim.INTRA_NODE_GBPS["V100"] * 1e9)
    inter = k * 14 * net.alpha_s + 14 / 8 * m * 8 / 100e9
    assert hier == pytest.approx(intra + inter)
    every4 = sim.allreduce_time(ws, m, sim.Network(collective="hierarchical", average_every=4))
    assert every4 == pytest.approx(intra + inter / 4)


# -- one step ---------------------------------------------------------------------------------


def test_one_worker_is_fully_efficient():
    for workers in (
        homogeneous(1),
        sim.catalog_cluster([("g5.xlarge", 1)], catalog(), RESNET, 0.3),
    ):
        for job in (
            sim.Job(RESNET, local_batch=64),
            sim.Job(RESNET, global_batch=256, step_overhead_s=0.01),
        ):
            p = sim.simulate_step(workers, job, sim.Network(), "baseline")
            assert p.efficiency == pytest.approx(1.0) and p.comm_s == 0.0


def test_step_arithmetic_by_hand():
    ws = [
        sim.WorkerModel("a", 0.01, 0.002, link_gbps=8.0),
        sim.WorkerModel("b", 0.02, 0.001, link_gbps=8.0),
    ]
    model = sim.ModelSpec(
        "toy", params=1_000_000, per_sample_flops=1.0, sample_bytes=1.0, epoch_samples=1000
    )
    job = sim.Job(model, global_batch=100, step_overhead_s=0.005)
    net = sim.Network(alpha_s=1e-4)
    p = sim.simulate_step(ws, job, net, "baseline")
    assert p.local_batches == [50, 50]
    compute = max(0.01 + 0.002 * 50, 0.02 + 0.001 * 50)
    k = net.buckets(4e6)  # 1 MiB first bucket, then the rest: 2 all-reduces
    assert k == 2
    comm = k * 2 * 1e-4 + 1.0 * 4e6 * 8 / 8e9
    assert p.step_time_s == pytest.approx(compute + 0.005 + comm)
    assert p.throughput_samples_per_s == pytest.approx(100 / p.step_time_s)
    assert p.epoch_time_s == pytest.approx(1000 / p.throughput_samples_per_s)
    ideal = 50 / (0.01 + 0.1 + 0.005) + 50 / (0.02 + 0.05 + 0.005)
    assert p.efficiency == pytest.approx(p.throughput_samples_per_s / ideal)
    opt = sim.simulate_step(ws, job, net, "optimized")
    assert opt.local_batches == balance_batches([0.002, 0.001], [0.01, 0.02], 100)


def test_a_profiled_worker_computes_as_the_profile_fit_says():
    # The profile times the step through DDP, so nothing more is charged for DDP's bucket work,
    # whatever else the profile holds (its copy bandwidth among the raw probes).
    profile = sim.as_profile(
        {
            "cluster": "one",
            "model": "cnn",
            "ranks": [
                {
                    "rank": 0,
                    "fit_latency_s": 0.01,
                    "fit_s_per_sample": 0.001,
                    "samples_per_s": 500.0,
                    "step_compute_s": 0.042,
                    "memory_gbps": 2.0,
                    "allreduce_gbps": 1.0,
                }
            ],
        }
    )
    (w,) = sim.profile_workers(profile)
    assert w.compute_s(32) == pytest.approx(0.042)
    model = sim.ModelSpec(
        "toy", params=250_000_000, per_sample_flops=1.0, sample_bytes=1.0, epoch_samples=1
    )
    p = sim.simulate_step([w], sim.Job(model, global_batch=32), sim.Network())
    assert p.compute_s == pytest.approx(0.042) and p.efficiency == pytest.approx(1.0)


def test_cost_per_epoch_charges_whole_instances():
    cat = catalog()
    one_gpu = sim.catalog_cluster([("p3dn.24xlarge", 1)], cat, RESNET, 0.3, n=1)
    assert len(one_gpu) == 1 and one_gpu[0].usd_per_hour == pytest.approx(31.212)
    p = sim.simulate_step(one_gpu, sim.Job(RESNET, local_batch=64), sim.Network(), "baseline")
    assert p.cost_per_epoch == pytest.approx(31.212 * p.epoch_time_s / 3600)
    full = sim.catalog_cluster([("p3dn.24xlarge", 1)], cat, RESNET, 0.3)
    assert sum(w.usd_per_hour for w in full) == pytest.approx(31.212)


def test_storage_model_adds_data_wait_only_when_reads_outrun_compute():
    fast = homogeneous(2)
    slow = [replace(w, storage_mbps=1.0) for w in fast]  # 1 Mbit/s: reading dominates
    job = sim.Job(RESNET, local_batch=8)
    p0 = sim.simulate_step(fast, job, sim.Network(), "baseline")
    p1 = sim.simulate_step(slow, job, sim.Network(), "baseline")
    read = 8 * RESNET.sample_bytes * 8 / 1e6
    assert p0.data_wait_s == 0.0
    assert p1.data_wait_s == pytest.approx(read - 8 * 0.01)  # prefetch overlaps compute
    no_prefetch = sim.simulate_step(slow, replace(job, prefetch=False), sim.Network(), "baseline")
    assert no_prefetch.data_wait_s == pytest.approx(read)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 256), st.floats(0.0, 1e-3), st.floats(1e-6, 1e-3))
def test_efficiency_degrades_monotonically_with_latency(n, alpha, extra):
    job = sim.Job(RESNET, local_batch=32)
    ws = homogeneous(n)
    lo = sim.simulate_step(ws, job, sim.Network(alpha_s=alpha), "baseline").efficiency
    hi = sim.simulate_step(ws, job, sim.Network(alpha_s=alpha + extra), "baseline").efficiency
    assert hi < lo <= 1.0


def test_efficiency_falls_with_workers_on_a_fixed_link():
    job = sim.Job(RESNET, local_batch=32)
    effs = [
        sim.simulate_step(homogeneous(n), job, sim.Network(alpha_s=20e-6), "baseline").efficiency
        for n in (1, 2, 4, 16, 64, 256, 1024)
    ]
    assert effs[0] == pytest.approx(1.0)
    assert all(b < a for a, b in itertools.pairwise(effs))


speeds = st.lists(st.floats(1e-3, 1e-1), min_size=2, max_size=24)


@settings(max_examples=60, deadline=None)
@given(speeds, st.lists(st.floats(0.0, 0.05), min_size=24, max_size=24), st.integers(0, 2000))
def test_optimized_is_never_slower_than_the_equal_split(per_sample, latency, extra):
    n = len(per_sample)
    ws = [sim.WorkerModel(f"w{i}", latency[i], c, link_gbps=10.0) for i, c in enumerate(per_sample)]
    job = sim.Job(RESNET, global_batch=n + extra)
    base = sim.simulate_step(ws, job, sim.Network(), "baseline")
    opt = sim.simulate_step(ws, job, sim.Network(), "optimized")
    assert opt.throughput_samples_per_s >= base.throughput_samples_per_s * (1 - 1e-9)
    assert opt.efficiency >= base.efficiency * (1 - 1e-9)


def test_optimized_equals_baseline_on_a_homogeneous_cluster():
    for n in (1, 3, 64):
        ws = homogeneous(n, a=0.01)
        job = sim.Job(RESNET, local_batch=64)
        base = sim.simulate_step(ws, job, sim.Network(), "baseline")
        opt = sim.simulate_step(ws, job, sim.Network(), "optimized")
        assert opt.local_batches == base.local_batches
        assert opt.throughput_samples_per_s == pytest.approx(base.throughput_samples_per_s)


def test_mixed_cluster_at_scale_gains_from_the_plan():
    cat = catalog()
    mix = [("g4dn.xlarge", 32), ("g5.xlarge", 16), ("p3dn.24xlarge", 2)]
    ws = sim.catalog_cluster(mix, cat, RESNET, 0.3)
    assert len(ws) == 64 and sum(w.kind == "p3dn.24xlarge" for w in ws) == 16
    job = sim.Job(RESNET, local_batch=64)
    base = sim.simulate_step(ws, job, sim.Network(), "baseline")
    opt = sim.simulate_step(ws, job, sim.Network(), "optimized")
    assert opt.throughput_samples_per_s > 1.1 * base.throughput_samples_per_s
    assert opt.cost_per_epoch < base.cost_per_epoch
    assert base.usd_per_hour == pytest.approx(32 * 0.526 + 16 * 1.006 + 2 * 31.212)
    # the fastest devices get the largest shares
    by_kind = {w.kind: b for w, b in zip(ws, opt.local_batches, strict=True)}
    assert by_kind["g5.xlarge"] > by_kind["p3dn.24xlarge"] > by_kind["g4dn.xlarge"]


def test_scaled_mix_keeps_proportions():
    assert sim.scale_counts([32, 16, 16], 1024) == [512, 256, 256]
    assert sum(sim.scale_counts([32, 16, 16], 7)) == 7
    ws = sim.catalog_cluster(
        [("g4dn.xlarge", 32), ("p3dn.24xlarge", 2)], catalog(), RESNET, 0.3, n=1024
    )
    assert len(ws) == 1024


def test_1024_workers_answer_with_bounded_work():
    """No wall-clock assertion: the sweep touches each worker a bounded number of times."""
    ws = sim.catalog_cluster(
        [("g4dn.xlarge", 32), ("g5.xlarge", 16), ("p3dn.24xlarge", 2)],
        catalog(),
        RESNET,
        0.3,
        n=1024,
    )
    calls = {"n": 0}
    original = sim.WorkerModel.compute_s

    def counting(self, *args):
        calls["n"] += 1
        return original(self, *args)

    sim.WorkerModel.compute_s = counting
    try:
        preds = sim.sweep(lambda n: ws, [1024], sim.Job(RESNET, local_batch=64), sim.Network())
    finally:
        sim.WorkerModel.compute_s = original
    assert [p.plan for p in preds] == ["baseline", "optimized"]
    assert calls["n"] <= 2 * 3 * 1024  # per plan: busy, compute-only, ideal


def test_profile_workers_read_the_fitted_model():
    profile = sim.as_profile(
        {
            "cluster": "two",
            "model": "cnn",
            "ranks": [
                {
                    "rank": 1,
                    "fit_latency_s": 0.02,
                    "fit_s_per_sample": 0.001,
                    "samples_per_s": 500,
                    "step_compute_s": 0.036,
                    "allreduce_gbps": 5.0,
                    "allreduce_latency_s": 0.003,
                },
                {
                    "rank": 0,
                    "fit_latency_s": -0.01,
                    "fit_s_per_sample": 0.0,
                    "samples_per_s": 100,
                    "step_compute_s": 0.16,
                    "allreduce_gbps": 4.0,
                    "allreduce_latency_s": 0.001,
                },
            ],
        }
    )
    ws = sim.profile_workers(profile)
    assert [(w.latency_s, w.per_sample_s, w.link_gbps) for w in ws] == [
        (0.0, 0.01, 4.0),
        (0.02, 0.001, 5.0),
    ]
    assert sim.profile_alpha_s(profile) == pytest.approx(0.003 / 2)
    big = sim.replicate(ws, 5)
    assert len(big) == 5 and len({w.node for w in big}) == 5 and big[3].per_sample_s == 0.001


def test_a_profile_json_is_read_as_the_typed_profile():
    # `hetflow profile --json` writes the Profile's fields with its report's beside them
    data = {
        "cluster": "c",
        "model": "cnn",
        "workers": [{"name": "w0"}],
        "cluster_spec": {},
        "ranks": [
            {
                "rank": 0,
                "node": "n0",
                "fit_latency_s": 0.01,
                "fit_s_per_sample": 0.002,
                "samples_per_s": 400.0,
                "step_compute_s": 0.07,
            }
        ],
    }
    profile = sim.as_profile(data)
    assert isinstance(profile, Profile) and profile.ranks[0].fit_s_per_sample == 0.002
    (w,) = sim.profile_workers(profile)
    assert (w.latency_s, w.per_sample_s, w.name, w.kind) == (0.01, 0.002, "rank0", "profiled")


def test_local_model_figures_match_the_digits_recipes():
    from hetflow.training.recipes import DataInfo, get_recipe, parameter_count, seeded_model

    for old, name in (
        ("mlp", "digits-mlp"),
        ("cnn", "digits-cnn"),
        ("wide_mlp", "digits-wide-mlp"),
    ):
        params = parameter_count(seeded_model(get_recipe(name), DataInfo(), 0))
        assert sim.MODELS[name].params == sim.MODELS[old].params == params
        module = sim.MODELS[name].source.split()[0]  # what it cites: a module that exists
        assert module == get_recipe(name).__class__.__module__


# -- the published tables ---------------------------------------------------------------------


def test_every_published_table_names_its_source_at_a_commit():
    import re

    for t in sim.TABLES:
        assert re.fullmatch(
            r"https://github\.com/NVIDIA/DeepLearningExamples/blob/[0-9a-f]{40}/\S+\.md", t.source
        ), t.key
        assert t.section and t.batch_source and len(t.rows) >= 2
        roles = t.roles()
        assert set(roles) == set(t.rows) and published.HELD_OUT in roles.values()
        assert roles[min(t.rows)] == published.FIT_C
    assert len({t.key for t in sim.TABLES}) == len(sim.TABLES)


def _with_held_out_scaled(tables, factor):
    out = []
    for t in tables:
        rows = {
            n: v * factor if t.roles()[n] == published.HELD_OUT else v for n, v in t.rows.items()
        }
        out.append(replace(t, rows=rows))
    return tuple(out)


def test_the_fit_never_reads_a_held_out_row():
    base = published.fit()
    moved = published.fit(_with_held_out_scaled(sim.TABLES, 1.7))
    assert moved.alpha_s == base.alpha_s
    assert moved.per_sample_s == base.per_sample_s
    assert moved.node_gbps == base.node_gbps


def test_held_out_error_is_the_prediction_against_the_row():
    f = published.fit()
    pub = sim.published_comparison()
    tables = {t.key: t for t in sim.TABLES}
    held = [r for r in pub["rows"] if r["role"] == published.HELD_OUT]
    assert pub["held_out_rows"] == len(held) > 0
    for r in pub["rows"]:
        t = tables[r["table"]]
        p = published.predict(
            t, r["gpus"], f.per_sample_s[t.key], f.alpha_s, f.node_gbps.get(t.key)
        )
        assert r["theirs_samples_per_s"] == t.rows[r["gpus"]]
        assert r["rel_error"] == pytest.approx(p.throughput_samples_per_s / t.rows[r["gpus"]] - 1)
    errors = [abs(r["rel_error"]) for r in held]
    assert pub["held_out_max_abs_error"] == pytest.approx(max(errors))
    assert pub["held_out_mean_abs_error"] == pytest.approx(sum(errors) / len(errors))
    # a held-out row 10% higher is predicted exactly as before: its error moves with it
    moved = sim.published_comparison(_with_held_out_scaled(sim.TABLES, 1.1))
    for a, b in zip(pub["rows"], moved["rows"], strict=True):
        if a["role"] == published.HELD_OUT:
            assert b["ours_samples_per_s"] == pytest.approx(a["ours_samples_per_s"])
            assert 1 + b["rel_error"] == pytest.approx((1 + a["rel_error"]) / 1.1)


def test_rows_solved_for_exactly_are_reproduced():
    # c and a link are solved from one row each: those rows are met by construction
    for r in sim.published_comparison()["rows"]:
        if r["role"] in (published.FIT_C, published.FIT_LINK):
            assert r["rel_error"] == pytest.approx(0.0, abs=1e-9), r


def test_the_fit_recovers_a_simulated_table():
    # rows the simulator itself produced at known figures: the fit finds them, and the held-out
    # rows are then predicted without error
    truth_c, truth_alpha, truth_gbps = 0.02, 30e-6, 400.0
    by_key = {t.key: t for t in sim.TABLES}
    single = replace(
        by_key["bert-large-dgx2-fp32"], key="single", rows=dict.fromkeys([1, 4, 8, 16], 1.0)
    )
    multi = replace(
        by_key["bert-large-dgx2h-nodes-mixed"], key="multi", rows=dict.fromkeys([16, 64, 256], 1.0)
    )
    made = []
    for t, gbps in ((single, None), (multi, truth_gbps)):
        rows = {
            n: published.predict(t, n, truth_c, truth_alpha, gbps).throughput_samples_per_s
            for n in t.rows
        }
        made.append(replace(t, rows=rows))
    f = published.fit(tuple(made))
    assert f.alpha_s == pytest.approx(truth_alpha)
    assert f.per_sample_s == pytest.approx({"single": truth_c, "multi": truth_c})
    assert f.node_gbps["multi"] == pytest.approx(truth_gbps)
    pub = sim.published_comparison(tuple(made))
    assert pub["held_out_max_abs_error"] == pytest.approx(0.0, abs=1e-9)


# -- bad input --------------------------------------------------------------------------------


def test_unknown_instance_type_is_a_clear_error():
    with pytest.raises(ConfigError, match="g9.enormous"):
        sim.catalog_cluster([("g9.enormous", 2)], catalog(), RESNET, 0.3)


def test_bad_mix_and_worker_counts():
    with pytest.raises(ConfigError, match="--mix"):
        sim.parse_mix("g5.xlarge")
    with pytest.raises(ConfigError, match="--mix"):
        sim.parse_mix("g5.xlarge:0")
    with pytest.raises(ConfigError, match="twice"):
        sim.parse_mix("g5.xlarge:1,g5.xlarge:2")
    for bad in (0, -3, 1.5):
        with pytest.raises(ConfigError, match="workers"):
            sim.check_workers(bad)
    with pytest.raises(ConfigError, match="workers"):
        sim.simulate_step([], sim.Job(RESNET, local_batch=1), sim.Network())
    with pytest.raises(ConfigError, match="workers"):
        sim.ring_allreduce_time(1.0, 0, 0.0, 1.0)


def test_bad_figures_are_clear_errors():
    with pytest.raises(ConfigError, match="per_sample_s"):
        sim.WorkerModel("w", 0.0, 0.0)
    with pytest.raises(ConfigError, match="link_gbps"):
        sim.WorkerModel("w", 0.0, 1.0, link_gbps=-1.0)
    with pytest.raises(ConfigError, match="exactly one"):
        sim.Job(RESNET)
    with pytest.raises(ConfigError, match="compression_ratio"):
        sim.Network(compression_ratio=0.5)
    with pytest.raises(ConfigError, match="collective"):
        sim.Network(collective="tree")
    with pytest.raises(ConfigError, match="plan"):
        sim.simulate_step(homogeneous(2), sim.Job(RESNET, local_batch=2), sim.Network(), "fastest")
    with pytest.raises(ConfigError, match="fraction"):
        sim.catalog_cluster([("g5.xlarge", 1)], catalog(), RESNET, 1.5)
    with pytest.raises(ConfigError, match="global_batch"):
        sim.simulate_step(homogeneous(4), sim.Job(RESNET, global_batch=2), sim.Network())
    with pytest.raises(ConfigError, match="profile"):
        sim.profile_workers(Profile(cluster="none", model="cnn", ranks=[]))
    with pytest.raises(ConfigError, match="profile"):
        sim.as_profile({"ranks": []})
    with pytest.raises(ConfigError, match="fit_latency_s"):
        sim.as_profile(
            {
                "cluster": "c",
                "model": "cnn",
                "ranks": [
                    {
                        "rank": 0,
                        "fit_s_per_sample": 0.01,
                        "samples_per_s": 100,
                        "step_compute_s": 0.3,
                    }
                ],
            }
        )
