"""`hetflow bench recommend --cpu-quotas`: recommend checked on real workers under kernel CPU
quotas. The quota rule (published peaks only), the mixes run, the figures that set measured
beside predicted (pure); bad input in one line; one short real run on two workers (slow)."""

from __future__ import annotations

import pytest

from hetflow.config import ConfigError
from hetflow.emulation.presets import PRESETS
from hetflow.infra.market import load_market

from benchmarks.recommend import parser
from benchmarks.recommend.quota_figures import (
    QUOTA_MIN,
    mix_row,
    mixes_to_run,
    profile_batches,
    quota_rule,
    relative_error,
    throttled_share,
    worker_rows,
)
from benchmarks.recommend.quotas import type_quotas


def test_the_quota_follows_the_published_peaks_the_fastest_at_the_cores_given():
    peaks = {"t4": PRESETS["t4"].peak_samples_per_s, "v100": PRESETS["v100"].peak_samples_per_s}
    quotas = quota_rule(peaks, 0.8)
    assert quotas["v100"] == 0.8  # the fastest
    assert quotas["t4"] == pytest.approx(0.8 * peaks["t4"] / peaks["v100"], abs=0.005)
    assert quota_rule(peaks, 1.6)["t4"] == pytest.approx(2 * quotas["t4"], abs=0.01)


def test_a_quota_is_never_under_what_the_kernel_takes():
    assert quota_rule({"slow": 1.0, "fast": 1000.0}, 1.0) == {"slow": QUOTA_MIN, "fast": 1.0}
    with pytest.raises(ValueError, match="top_cores"):
        quota_rule({"a": 1.0}, 0.05)


def test_the_bench_maps_each_candidate_type_by_its_gpus_published_peak():
    args = parser().parse_args(
        ["--cpu-quotas", "--candidates", "g4dn.xlarge:2,p3.2xlarge:1,p4d.24xlarge:1"]
    )
    mix, quotas = type_quotas(args, load_market())
    assert [t for t, _ in mix] == ["g4dn.xlarge", "p3.2xlarge", "p4d.24xlarge"]
    assert quotas["p4d.24xlarge"] == args.quota_cores  # A100: the fastest published peak
    assert quotas["g4dn.xlarge"] < quotas["p3.2xlarge"] < quotas["p4d.24xlarge"]


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--candidates", "c5.xlarge:1,g4dn.xlarge:1"], "--candidates"),
        (["--quota-cores", "0.05"], "--quota-cores"),
    ],
)
def test_bad_input_is_one_line_naming_its_flag(argv, flag):
    args = parser().parse_args(["--cpu-quotas", *argv])
    with pytest.raises(ConfigError, match=f"^{flag}: "):
        type_quotas(args, load_market())


def test_the_profile_spans_the_local_batches_the_mixes_run():
    assert profile_batches(512) == [64, 128, 256, 512]
    assert profile_batches(300) == [32, 64, 128, 256]
    assert profile_batches(1) == [1]


def test_the_mixes_run_are_the_choice_a_mixed_one_and_each_type_alone_within_the_ranks():
    ranked = [(2, 0), (1, 0), (1, 1), (2, 1), (0, 1), (0, 2)]
    singles = [(2, 0), (0, 1)]
    assert mixes_to_run(ranked, singles, [1, 1], 4, 4) == [(2, 0), (1, 1), (0, 1), (1, 0)]
    assert mixes_to_run(ranked, singles, [1, 4], 4, 9) == [(2, 0), (0, 1), (1, 0)]  # <= 4 GPUs
    assert mixes_to_run(ranked, singles, [1, 1], 4, 1) == [(2, 0)]


def test_a_mixs_errors_are_computed_from_its_measured_steps():
    steps = [0.9, 0.5, 0.4, 0.2, 0.2, 0.3]  # the first three: warm-up
    predicted = {"step_s": 0.15, "hours": 0.15 * 1000 / 3600, "cost_usd": 2.0 * 0.15 * 1000 / 3600}
    row = mix_row(predicted, steps, 3, 6, 1000, 2.0, 12.5)
    assert row["measured_step_s"] == 0.2  # the median after the warm-up
    assert row["step_error"] == pytest.approx((0.2 - 0.15) / 0.2)
    assert row["measured_train_s"] == pytest.approx(2.5)
    assert row["train_error"] == pytest.approx((2.5 - 0.9) / 2.5)
    assert row["wall_error"] == pytest.approx((12.5 - 0.9) / 12.5)
    assert row["measured_cost_usd"] == pytest.approx(2.0 * 0.2 * 1000 / 3600)
    assert row["cost_error"] == pytest.approx(row["hours_error"]) == pytest.approx(0.25)


def test_each_worker_gets_its_measured_compute_beside_its_curve():
    rows = worker_rows(
        ["a", "b"],
        [0.2, 0.5],
        [0.2, 0.5],
        [10, 30],
        [0.1, 0.1],
        [[9, 1, 1, 0.2], [9, 1, 1, 0.08]],
        3,
    )
    assert [r["measured_compute_s"] for r in rows] == [0.2, 0.08]
    assert rows[0]["compute_error"] == pytest.approx(0.5)
    assert rows[1]["compute_error"] == pytest.approx(relative_error(0.08, 0.1))


def test_the_throttled_share_reads_the_later_half_of_the_job():
    """Start-up (its first half here) is left out; a worker that used up its quota in every
    period it ran reads 1, one held below it by something else reads less."""
    bound = [(0.0, 0, 0), (1.0, 50, 10), (2.0, 100, 60), (3.0, 150, 110)]
    assert throttled_share(bound) == 1.0
    held = [(0.0, 0, 0), (1.0, 50, 50), (2.0, 100, 60), (3.0, 150, 70)]
    assert throttled_share(held) == pytest.approx(0.2)
    assert throttled_share([(0.0, 0, 0)]) is None
    assert throttled_share([(0.0, 5, 0), (1.0, 5, 0)]) is None  # no period with work
