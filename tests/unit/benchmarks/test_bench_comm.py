"""`hetflow bench comm` end to end, small: 2 methods, a few steps, the small MLP."""

from __future__ import annotations

import pytest

from hetflow.cli import main as cli_main
from hetflow.config import ConfigError

from benchmarks.comm import main, parse_methods
from benchmarks.comm.figures import combine_repeats, method_metrics, paired_cuts


def test_bench_comm_is_reachable_from_the_cli(capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(["bench", "comm", "--help"])
    assert e.value.code == 0
    assert "--link-gbps" in capsys.readouterr().out


@pytest.mark.parametrize(
    "text, expected",
    [
        ("none,gzip", "unknown method"),
        ("topk:2", "topk ratio"),
        ("", "at least one"),
        ("none,none", "twice"),
        ("auto", "chosen"),
    ],
)
def test_bench_comm_refuses_bad_methods(text, expected):
    with pytest.raises(ConfigError) as e:
        parse_methods(text)
    assert str(e.value).startswith("--methods") and expected in str(e.value)


@pytest.mark.parametrize(
    "argv, field", [(["--link-gbps", "-1"], "--link-gbps"), (["--repeat", "0"], "--repeat")]
)
def test_bench_comm_refuses_bad_numbers_before_launching(tmp_path, argv, field):
    with pytest.raises(ConfigError, match=field):
        main([*argv, "--json", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()


def test_repeats_take_median_times_and_pair_cuts_by_round():
    def run(step, acc):
        return {
            "step_time_s": step,
            "compute_time_s": step / 2,
            "comm_time_s": step / 4,
            "idle_time_s": 0.0,
            "bytes_per_step": 8.0,
            "final_accuracy": acc,
            "wall_s": 10.0,
        }

    none = combine_repeats([run(0.40, 0.9), run(0.50, 0.8), run(0.44, 0.7)])
    fast = combine_repeats([run(0.20, 0.9), run(0.40, 0.9), run(0.33, 0.9)])
    assert (
        none["step_time_s"] == 0.44 and none["compute_time_s"] == 0.22
    )  # medians, not the first run
    assert none["step_time_s_range"] == [0.40, 0.50]
    assert none["step_time_s_runs"] == [0.40, 0.50, 0.44] and none["wall_s"] == 30.0
    assert none["final_accuracy"] == 0.9  # the first run's training figures
    cuts = paired_cuts({"none": none, "powersgd:4": fast}, "powersgd:4")
    assert cuts == pytest.approx([0.5, 0.2, 0.25])  # round by round, not median against median
    assert paired_cuts({"powersgd:4": fast}, "powersgd:4") == []


def test_method_metrics_skip_warmup_and_average_over_ranks():
    def rec(step, nbytes, step_s=1.0):
        return {
            "step": step,
            "bytes_sent": nbytes,
            "step_s": step_s,
            "compute_s": 0.25,
            "comm_s": 0.5,
            "idle_s": 0.0,
            "loss_sum": 64.0,
            "batch": 64,
        }

    ranks = [
        {
            "rank": r,
            "params": 10,
            "evals": [{"accuracy": 0.9}],
            "records": [rec(0, 100.0, 9.0), rec(1, 100.0), rec(2, 10.0), rec(3, 10.0)],
        }
        for r in range(2)
    ]
    m = method_metrics({"ranks": ranks}, global_batch=128, skip=2)
    assert m["bytes_per_step"] == 10.0 and m["run_bytes_per_step"] == 55.0
    assert m["step_time_s"] == 1.0 and m["comm_time_s"] == 0.5
    assert m["final_loss"] == 1.0 and m["final_accuracy"] == 0.9
