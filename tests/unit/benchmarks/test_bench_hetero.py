"""`hetflow bench hetero`'s pure pieces and argument checks (the benchmark itself is measured,
not tested)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from hetflow.config import ConfigError

from benchmarks.hetero import main
from benchmarks.hetero.aggregate import median_run, with_speedups, with_time_to_target
from benchmarks.hetero.model import at_run_pace, compute_model_error


def test_compute_model_error_compares_measured_compute_with_the_plans_model():
    def rec(step, batch, compute_s):
        return {"step": step, "batch": batch, "compute_s": compute_s}

    result = {
        "ranks": [
            # rank 1 first: ranks are matched by number, not by position
            {
                "rank": 1,
                "records": [rec(0, 4, 9.0), rec(1, 4, 0.12), rec(2, 4, 0.14), rec(3, 6, 0.5)],
            },
            {
                "rank": 0,
                "records": [rec(0, 2, 9.0), rec(1, 2, 0.05), rec(2, 2, 0.05), rec(3, 2, 5.0)],
            },
        ]
    }
    # planned: rank 0 0.01 + 0.02 x 2 = 0.05; rank 1 0.02 + 0.02 x 4 = 0.10
    errors = compute_model_error(result, [2, 4], [0.01, 0.02], [0.02, 0.02], until_step=3)
    # step 0 (set-up) and steps from until_step on (a straggler) are left out; so is a step
    # whose batch is not the plan's (a re-plan)
    assert errors == [pytest.approx(0.0), pytest.approx(0.3)]
    assert compute_model_error(result, [3, 4], [0.01, 0.02], [0.02, 0.02], until_step=3)[0] is None


def test_the_hosts_pace_is_the_median_ranks_error_and_leaves_the_ranks_spread_around_it():
    out = at_run_pace(0.8, [0.10, None, 0.12, 0.05])
    assert out["host_pace"] == pytest.approx(1.10)  # the median of the ranks measured
    assert out["efficiency_at_run_pace"] == pytest.approx(0.88)
    spread = out["compute_model_error_at_run_pace"]
    assert spread[1] is None  # left out: nothing measured
    assert spread[0] == pytest.approx(0.0)
    assert spread[2] == pytest.approx(1.12 / 1.10 - 1)
    assert spread[3] == pytest.approx(1.05 / 1.10 - 1)
    assert at_run_pace(0.8, [None, None])["efficiency_at_run_pace"] is None


@pytest.mark.parametrize("pace", [0.9, 1.17])
def test_the_ideal_at_the_runs_pace_is_the_profiles_over_the_pace(pace):
    # what efficiency_at_run_pace = efficiency x pace rests on: every worker's a_i and c_i
    # scaled alike scales the balanced step alike, a worker left out for its fixed cost included
    from hetflow.training.plan.planner import ideal_throughput

    latency, per_sample = [0.004, 0.012, 0.030, 0.050], [0.0005, 0.0015, 0.001, 0.003]
    ideal = ideal_throughput(latency, per_sample, 128)
    assert 128 / ideal < latency[3]  # the balanced step leaves the last worker out
    slower = ideal_throughput([pace * a for a in latency], [pace * c for c in per_sample], 128)
    assert slower == pytest.approx(ideal / pace, rel=1e-6)


def test_median_run_reports_each_headline_figures_own_median_and_keeps_the_rest_together():
    def run(tp, e2e, plan):
        return {
            "throughput_samples_per_s": tp,
            "end_to_end_s": e2e,
            "efficiency": tp / 100,
            "final_plan": plan,
        }

    runs = [run(90.0, 10.0, [1]), run(70.0, 30.0, [2]), run(80.0, 40.0, [3])]
    out = median_run(runs)
    assert out["throughput_samples_per_s"] == 80.0 and out["final_plan"] == [3]
    # the median end to end, not the end to end of the run of median throughput (40.0)
    assert out["end_to_end_s"] == 30.0 and out["end_to_end_s_range"] == [10.0, 40.0]
    assert out["throughput_samples_per_s_range"] == [70.0, 90.0]
    assert out["efficiency_runs"] == [0.9, 0.7, 0.8]  # in the order they ran
    even = median_run(runs[:2])
    assert even["final_plan"] == [2] and even["throughput_samples_per_s"] == 80.0
    assert "efficiency_runs" not in runs[2]  # the runs themselves are left as they were


def test_speedups_are_paired_within_a_round_then_their_median_is_reported():
    def run(tp, e2e):
        return {"throughput_samples_per_s": tp, "end_to_end_s": e2e, "efficiency": tp / 200}

    # the host slows down in round 1: both variants alike
    runs = {
        "baseline": [run(100.0, 20.0), run(50.0, 40.0), run(100.0, 20.0)],
        "static": [run(150.0, 10.0), run(60.0, 40.0), run(120.0, 10.0)],
    }
    out = with_speedups(runs)["static"]
    assert out["speedup_vs_baseline"] == pytest.approx(1.2)  # of 1.5, 1.2, 1.2
    assert out["speedup_vs_baseline_range"] == pytest.approx([1.2, 1.5])
    assert out["end_to_end_speedup"] == 2.0 and out["end_to_end_speedup_range"] == [1.0, 2.0]
    assert with_speedups(runs)["baseline"]["speedup_vs_baseline"] == 1.0


def test_the_table_shows_a_median_with_its_spread_and_a_single_run_without_one():
    from benchmarks.hetero.table import cell

    row = {"end_to_end_s": 30.0, "end_to_end_s_range": [10.0, 40.0], "replans": 2}
    assert cell(row, "end_to_end_s") == "30.000 (10.000-40.000)"
    assert cell({"end_to_end_s": 3.0, "end_to_end_s_range": [3.0, 3.0]}, "end_to_end_s") == "3.000"
    assert cell(row, "replans") == "2" and cell(row, "final_plan") == "-"


def test_each_round_runs_the_variants_rotated_and_says_in_which_order(monkeypatch, capsys):
    from types import SimpleNamespace

    from hetflow.config import TrainConfig

    import benchmarks.hetero as hetero
    from benchmarks.hetero import parse_args, run_rounds

    ran = []

    def fake_run(name, round_, bench, profile, dataset, tmp):
        ran.append((round_, name))
        return {}, SimpleNamespace(local_batches=[1]), TrainConfig(), [1]

    monkeypatch.setattr(hetero, "run_variant", fake_run)
    figures = {"throughput_samples_per_s": 1.0, "efficiency": 1.0, "final_plan": [1]}
    monkeypatch.setattr(hetero, "variant_figures", lambda *a: dict(figures))
    _, bench = parse_args(["--repeat", "3", "--variants", "baseline,static,dynamic"])
    bench = hetero.replace(bench, stragglers=[])
    runs = run_rounds(bench, None, None, None, "")
    assert [n for r, n in ran if r == 1] == ["static", "dynamic", "baseline"]
    assert [runs[n][2]["position"] for n in ("baseline", "static", "dynamic")] == [1, 2, 0]
    assert "round 2: dynamic, baseline, static (dynamic first)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, field",
    [
        (["--repeat", "0"], "--repeat"),
        (["--jitter", "1.5"], "jitter"),
        (["--time-scale", "0"], "time_scale"),
    ],
)
def test_bench_hetero_refuses_bad_numbers_before_launching(tmp_path, argv, field):
    # the CLI turns either into one line naming the field
    # (tests/{unit,integration}/cli/test_bad_input.py)
    with pytest.raises((ConfigError, ValidationError), match=field):
        main([*argv, "--json", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()


def test_launcher_ray_runs_every_variant_on_torchrun_and_on_ray():
    from benchmarks.hetero import parse_args

    _, bench = parse_args(["--launcher", "ray", "--variants", "baseline,dynamic"])
    assert bench.variants == ["baseline", "baseline@ray", "dynamic", "dynamic@ray"]
    _, bench = parse_args(["--variants", "static"])
    assert bench.variants == ["static"]


def test_devices_precision_and_real_heterogeneity_flags():
    from benchmarks.hetero import parse_args

    _, bench = parse_args(["--devices", "cuda,cpu,cpu,cpu", "--precision", "auto", "--no-emulate"])
    assert [w.device for w in bench.cluster.workers] == ["cuda", "cpu", "cpu", "cpu"]
    assert bench.base.precision == "auto" and not bench.cluster.emulate
    _, bench = parse_args(["--devices", "cpu"])
    assert {w.device for w in bench.cluster.workers} == {"cpu"} and bench.cluster.emulate
    with pytest.raises(ConfigError, match="--devices: 2 devices for 4 workers"):
        parse_args(["--devices", "cpu,cpu"])


def test_several_precisions_run_every_variant_in_each():
    from benchmarks.hetero import parse_args

    _, bench = parse_args(["--precision", "fp32,bf16", "--variants", "static"])
    assert bench.variants == ["static@fp32", "static@bf16"]
    with pytest.raises(ConfigError, match="--precision: 'fp8'"):
        parse_args(["--precision", "fp32,fp8"])


def _evals(*points, key="val_loss"):
    return {
        "evals": [{"step": 10 * i, "train_time_s": t, key: v} for i, (t, v) in enumerate(points)]
    }


def test_time_to_target_is_each_variants_time_to_what_baseline_ended_at():
    out = with_time_to_target(
        {
            "baseline": _evals((2.0, 3.0), (4.0, 2.5)),
            "static": _evals((1.0, 2.9), (2.0, 2.4)),
            "dynamic": _evals((1.0, 2.6), (2.0, 2.55)),  # never reaches 2.5
            "other": _evals((1.0, 2.6), (3.0, 2.500002)),  # 2.5 in another summing order
        }
    )
    assert out["other"]["time_to_baseline_final_s"] == 3.0
    assert out["baseline"]["time_to_target_speedup"] == 1.0
    assert (out["static"]["time_to_baseline_final_s"], out["static"]["time_to_target_speedup"]) == (
        2.0,
        2.0,
    )
    assert out["dynamic"]["time_to_baseline_final_s"] is None
    acc = with_time_to_target(
        {
            "baseline": _evals((3.0, 0.5), (6.0, 0.8), key="accuracy"),
            "static": _evals((2.0, 0.85), key="accuracy"),
        }
    )
    assert acc["static"]["time_to_target_speedup"] == 3.0  # accuracy: at least, not at most
    assert (
        "time_to_target_speedup"
        not in with_time_to_target({"static": _evals((1.0, 2.0))})["static"]
    )


def test_end_to_end_time_to_target_counts_the_profile_only_the_planned_variant_paid():
    walled = [{"step": 10, "train_time_s": 1.0, "wall_s": 20.0, "accuracy": 0.8}]
    out = with_time_to_target(
        {
            "baseline": {"evals": walled, "profiling_time_s": 0.0},
            "static": {
                "evals": [{"step": 10, "train_time_s": 0.5, "wall_s": 16.0, "accuracy": 0.8}],
                "profiling_time_s": 6.0,
            },
        }
    )
    # twice as fast in its steps, yet later end to end: its profile cost more than it saved
    assert out["static"]["time_to_target_speedup"] == 2.0
    assert out["static"]["end_to_end_time_to_baseline_final_s"] == 22.0
    assert out["static"]["end_to_end_time_to_target_speedup"] == pytest.approx(20.0 / 22.0)
    unwalled = with_time_to_target({"baseline": _evals((1.0, 2.0)), "s": _evals((1.0, 2.0))})
    assert unwalled["s"]["end_to_end_time_to_baseline_final_s"] is None


def test_a_rank_the_plan_left_at_batch_0_has_no_model_error():
    records = [{"step": s, "batch": 0, "compute_s": 0.0001} for s in range(4)]
    result = {"ranks": [{"rank": 0, "records": records}]}
    # its fixed cost alone was predicted: an empty step is no measure of it
    assert compute_model_error(result, [0], [0.01], [0.001], until_step=4) == [None]


def test_the_fastest_variant_runs_the_quickest_worker_that_holds_the_batch_alone():
    from hetflow.config import ClusterSpec
    from hetflow.records import Plan
    from hetflow.training.plan.planner import fastest_alone

    from benchmarks.hetero import parse_args

    plan = Plan(
        local_batches=[20, 50, 58],
        latency_s=[0.01, 0.002, 0.001],
        per_sample_s=[1e-3, 1e-5, 1e-5],
        caps=[None, None, 100],  # w2 is quicker, but cannot hold 128
    )
    alone = fastest_alone(plan, ClusterSpec.from_speeds([1, 2, 3]), 128)
    assert alone.local_batches == [0, 128, 0] and alone.dropped == ["w0", "w2"]
    assert parse_args(["--variants", "fastest,dynamic"])[1].variants == ["fastest", "dynamic"]


def test_the_ideal_with_the_all_reduce_prices_it_over_the_workers_the_ideal_uses():
    from hetflow.config import ClusterSpec, TrainConfig

    from benchmarks.hetero import Bench, ideals
    from tests.profiles import profile_of, rank_profile

    fig = {"grad_allreduce_s": 0.003, "allreduce_latency_s": 0.003}  # latency-bound
    fast = [rank_profile(r, 1000.0, **fig) for r in range(2)]
    hopeless = rank_profile(2, 1000.0, fit_latency_s=10.0, **fig)  # its fixed cost alone: 10 s
    bench = Bench(ClusterSpec.from_speeds([1, 1, 1]), TrainConfig(global_batch=64), [], [], 1)
    both = ideals(profile_of([*fast, hopeless]), bench)
    assert both.samples_per_s == pytest.approx(2000.0, rel=1e-6)
    assert both.allreduce_s == pytest.approx(0.0015)  # 2 ranks: 1 hop of the ring's 2, not 3 of 3
    all_three = ideals(profile_of([*fast, rank_profile(2, 1000.0, **fig)]), bench)
    assert all_three.allreduce_s == pytest.approx(0.003)
    assert all_three.with_allreduce_samples_per_s == pytest.approx(64 / (64 / 3000.0 + 0.003))


def _measured(cluster, speeds: list[float], profiling_time_s: float = 9.0):
    from tests.profiles import profile_of, rank_profile

    ranks = [
        rank_profile(i, s, worker=w.name, grad_bytes=400_000)
        for i, (w, s) in enumerate(zip(cluster.workers, speeds, strict=True))
    ]
    return profile_of(ranks, cluster=cluster.name, profiling_time_s=profiling_time_s)


def test_static_at_history_plans_as_a_second_run_from_each_types_entry_and_pays_no_profile():
    """Two workers of one type: a second run finds one entry for both (the first one's, as the
    profile measured it), so it plans them alike where static, planning from this invocation's
    profile, follows each one's own measurement."""
    from hetflow.config import ClusterSpec, TrainConfig
    from hetflow.training.plan.planner import make_plan

    from benchmarks.hetero.history import history_profile

    cluster, cfg = ClusterSpec.from_speeds([1, 1, 4]), TrainConfig(schedule="proportional")
    measured = _measured(cluster, [100.0, 60.0, 400.0])  # w1 measured slow: noise in one run
    second = history_profile(measured, cluster, cfg)
    assert second.profiling_time_s == 0.0
    assert [s.rsplit(": ", 1)[1] for s in second.sources] == ["w0", "w0", "w2"]
    assert [r.worker for r in second.ranks] == ["w0", "w1", "w2"]
    from_history = make_plan(second, cluster, cfg).local_batches
    from_profile = make_plan(measured, cluster, cfg).local_batches
    assert from_history[0] == from_history[1] and from_profile[1] < from_profile[0]
    assert from_history[2] > from_history[0]  # the fast type still gets the most


@pytest.mark.parametrize(
    "name, schedule, charged",
    [
        ("static", "proportional", True),
        ("static@history", "proportional", False),
        ("static@history@micro", "proportional", False),
        ("baseline", "equal", False),
        ("dynamic", "dynamic", False),
    ],
)
def test_only_a_variant_that_profiles_in_this_run_is_charged_its_profile(name, schedule, charged):
    from hetflow.config import ClusterSpec, TrainConfig

    from benchmarks.hetero.history import profile_charged_s

    cluster = ClusterSpec.from_speeds([1, 2])
    profile = _measured(cluster, [100.0, 200.0], profiling_time_s=9.0)
    cfg = TrainConfig(schedule=schedule)
    assert profile_charged_s(name, cfg, profile) == (9.0 if charged else 0.0)


@pytest.mark.parametrize("variant", ["dynamic@history", "baseline@history", "static@histry"])
def test_history_is_a_tag_of_static_only(variant):
    from benchmarks.hetero import parse_args

    with pytest.raises(ConfigError, match=r"^--variants: .*@history \(static only\)$"):
        parse_args(["--variants", f"baseline,{variant}"])
    assert parse_args(["--variants", "static,static@history"])[1].variants[1] == "static@history"
