"""`hetflow bench recommend`: the naive choices, the emulated clock and link, the figures that
compare measured with predicted (pure), and one short run (slow)."""

from __future__ import annotations

import pytest

from hetflow.config import ClusterSpec, ConfigError, WorkerSpec
from hetflow.emulation.link import Link
from hetflow.emulation.presets import PRESETS
from hetflow.forecast.rent.search import curve_for
from hetflow.forecast.simulate.models import MODELS

from benchmarks.recommend import main, parser, plan_choices
from benchmarks.recommend.figures import (
    device_seconds_per_emulated,
    even_host_peaks,
    link_for,
    measured_row,
    naive_mixes,
    phases,
    pooled_cpu_per_sample,
    typical_settled,
    versus_naive,
)


def test_naive_choices_rent_all_of_the_cheapest_all_of_the_fastest_and_equal_counts():
    prices, peaks, available = [3.0, 0.5, 30.0], [3000.0, 1500.0, 50000.0], [2, 5, 1]
    mixes = naive_mixes(prices, peaks, available)
    assert mixes["all-cheapest"] == (0, 5, 0)
    assert mixes["all-fastest"] == (0, 0, 1)
    assert mixes["equal-counts"] == (1, 1, 1)


def test_a_type_both_cheapest_and_fastest_is_both_naive_choices():
    mixes = naive_mixes([1.0, 2.0], [9.0, 3.0], [3, 4])
    assert mixes["all-cheapest"] == mixes["all-fastest"] == (3, 0)
    assert mixes["equal-counts"] == (3, 3)


def test_the_bench_plans_the_recommended_and_naive_mixes_from_the_candidates():
    args = parser().parse_args(["--candidates", "g4dn.xlarge:2,p3.2xlarge:2"])
    cands, rec, choices = plan_choices(args)
    assert choices["recommended"][0] == rec.best.counts
    assert choices["all-cheapest"][0] == (2, 0)  # g4dn is the cheaper per hour
    assert choices["all-fastest"][0] == (0, 2)
    assert choices["equal-counts"][0] == (2, 2)
    for counts, _, batches in choices.values():
        assert sum(map(sum, batches)) == args.global_batch
        assert [len(bs) for bs in batches] == [c.devices * n for c, n in zip(cands, counts)]


def test_a_mix_with_more_ranks_than_the_host_emulates_is_refused_naming_candidates():
    args = parser().parse_args(["--candidates", "g4dn.xlarge:3,p3.2xlarge:3", "--deadline-h", "5"])
    with pytest.raises(ConfigError, match="--candidates: .* more than --max-ranks 4"):
        plan_choices(args)


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("batch", [3, 40, 256])
def test_the_clock_turns_an_emulated_step_into_the_predicted_device_step(preset, batch):
    """A worker on the emulator's rule (slowdown x cpu(b) x shape(b)) with cpu(b) = c x b,
    converted by the clock, steps as recommend's curve predicts."""
    model, c, time_scale = MODELS["resnet50"], 2e-4, 16.0
    workers = [
        WorkerSpec(name=p, preset=p, speed=PRESETS[p].peak_samples_per_s / 1e3) for p in PRESETS
    ]
    cluster = ClusterSpec(workers=workers, time_scale=time_scale)
    i = list(PRESETS).index(preset)
    emulated = cluster.slowdowns()[i] * c * batch * workers[i].shape(batch)
    fastest = max(p.peak_samples_per_s for p in PRESETS.values())
    k = device_seconds_per_emulated(3.0, time_scale, fastest, c)
    _, curve = curve_for("x", preset.upper(), model, batch)
    assert emulated * k == pytest.approx(curve[batch - 1], rel=1e-9)


def test_the_link_carries_the_stand_ins_gradient_in_the_predicted_all_reduce():
    comm, k, time_scale, sent = 0.219, 11.5, 16.0, 510_000.0
    gbps = link_for(comm, k, time_scale, sent)
    assert Link(gbps, scale=time_scale).cost(sent, 1) * k == pytest.approx(comm)
    assert link_for(0.0, k, time_scale, sent) is None


def test_measured_figures_and_errors_from_a_synthetic_run():
    predicted = {"step_s": 0.5, "hours": 0.5 * 7200 / 3600, "cost_usd": 3.0 * 1.0}
    row = measured_row(predicted, emulated_step_s=0.05, k=12.0, steps=7200, usd_per_hour=3.0)
    assert row["measured_step_s"] == pytest.approx(0.6)
    assert row["measured_hours"] == pytest.approx(1.2)
    assert row["measured_cost_usd"] == pytest.approx(3.6)
    # the prediction was short by 1/6 of what was measured, on every figure alike
    for key in ("step_error", "hours_error", "cost_error"):
        assert row[key] == pytest.approx(1 / 6)
    assert measured_row(predicted, 0.04, 12.0, 7200, 3.0)["hours_error"] < 0


def test_versus_naive_takes_the_cheapest_naive_choice_that_met_the_deadline():
    rows = {
        "recommended": {"measured_hours": 1.9, "measured_cost_usd": 8.0},
        "all-cheapest": {"measured_hours": 3.2, "measured_cost_usd": 3.4},  # too slow
        "all-fastest": {"measured_hours": 1.6, "measured_cost_usd": 10.0},
        "equal-counts": {"measured_hours": 1.6, "measured_cost_usd": 12.0},
    }
    vs = versus_naive(rows, deadline_h=2.0)
    assert vs["best_naive"] == "all-fastest"
    assert vs["saving"] == pytest.approx(0.2)
    assert vs["recommended_meets_deadline"]
    assert versus_naive(rows, deadline_h=1.0) == {
        "recommended_meets_deadline": False,
        "best_naive": None,
        "saving": None,
    }
    assert versus_naive(rows, deadline_h=None)["best_naive"] == "all-cheapest"


def test_the_host_cost_is_pooled_over_the_workers_samples():
    cpu = {100: 0.012, 300: 0.030}
    assert pooled_cpu_per_sample(cpu, [100, 300, 0]) == pytest.approx(0.042 / 400)


def test_the_settled_cpu_is_the_typical_rolling_least_of_the_last_phases():
    records = [(0, 5.0), (1, 3.0), (0, 4.0), (1, 6.0), (0, 7.0)]
    # windows of 2: 5, 3, 3, 4, 6 -> median 4
    assert typical_settled(records, world=2, keep=1) == 4.0


def test_phases_take_the_slowest_ranks_medians_after_the_first_steps():
    fast = [{"compute_s": c, "data_s": 0.001, "step_s": 0.1} for c in (9.0, 0.02, 0.03, 0.04)]
    slow = [{"compute_s": c, "data_s": 0.002, "step_s": 0.1} for c in (9.0, 0.05, 0.07, 0.06)]
    went = phases([fast, slow, []], skip=1)
    assert went["compute_s"] == pytest.approx(0.06)
    assert went["data_s"] == pytest.approx(0.002)
    assert went["step_s"] == pytest.approx(0.1)


def test_even_host_speeds_put_every_worker_on_its_curve_despite_the_hosts_fixed_cost():
    """With cpu(b) = a + c x b (a host cost per step), the workers' emulated computes, converted
    by the clock, follow the curves again once their peaks are even_host_peaks'."""
    model, time_scale = MODELS["resnet50"], 32.0
    presets, batches = ["t4", "t4", "v100"], [60, 61, 131]
    cpu = {b: 0.004 + 7e-6 * b for b in set(batches)}
    plain = [PRESETS[p].peak_samples_per_s for p in presets]
    assert even_host_peaks(plain, batches, {b: 7e-6 * b for b in cpu}) == pytest.approx(plain)
    peaks = even_host_peaks(plain, batches, cpu)
    workers = [
        WorkerSpec(name=f"w{i}", preset=p, speed=s / 1e3)
        for i, (p, s) in enumerate(zip(presets, peaks))
    ]
    cluster = ClusterSpec(workers=workers, time_scale=time_scale)
    k = device_seconds_per_emulated(
        3.0, time_scale, max(peaks), pooled_cpu_per_sample(cpu, batches)
    )
    for w, slowdown, b, p in zip(workers, cluster.slowdowns(), batches, presets):
        _, curve = curve_for("x", p.upper(), model, b)
        assert slowdown * cpu[b] * w.shape(b) * k == pytest.approx(curve[b - 1], rel=1e-9)


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--deadline-h", "0"], "--deadline-h"),
        (["--run-steps", "-3"], "--run-steps"),
        (["--max-ranks", "0"], "--max-ranks"),
        (["--candidates", "g9.xlarge:1"], "--candidates"),
        (["--deadline-h", "0.01"], "--deadline-h"),  # no mix is that fast
    ],
)
def test_bad_input_is_one_line_naming_its_flag_before_anything_runs(argv, flag):
    with pytest.raises(ConfigError, match=f"^{flag}: ") as e:
        main(argv)
    assert "\n" not in str(e.value)
