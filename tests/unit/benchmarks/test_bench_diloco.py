"""`hetflow bench diloco`'s flags and figures (pure; the benchmark itself is measured, not
tested): sync at a setting fixed ahead, auto as its own row, targets fixed before the run,
several seeds, and the figures' medians with their spread."""

from __future__ import annotations

import pytest

from hetflow.config import ConfigError, TrainConfig

from benchmarks.diloco_figures import progress_line, summarize_links, table


def test_sync_runs_at_the_setting_fixed_ahead_and_auto_is_a_row_of_its_own():
    from benchmarks.diloco import variant_config

    base = TrainConfig(schedule="proportional")
    assert variant_config("sync", base).compression == "none"  # no trials by default
    assert variant_config("sync", base, "bf16").compression == "bf16"
    assert variant_config("sync@none", base, "bf16").compression == "none"
    assert variant_config("auto", base).compression == "auto"
    stale = variant_config("diloco@int8@stale2", base)
    assert (stale.strategy, stale.diloco.send, stale.diloco.staleness) == ("diloco", "int8", 2)
    for bad in ("diloco@fp8", "auto@none", "sync@auto"):
        with pytest.raises(ConfigError, match=rf"^--variants: '{bad}'"):
            variant_config(bad, base)


def test_the_flags_give_the_seeds_from_the_first_and_the_sync_setting():
    from benchmarks.diloco import parse_args

    a, links, seeds = parse_args(["--links", "1,0.1", "--seed", "5"])
    assert links == [1.0, 0.1] and seeds == [5, 6, 7]  # three seeds by default
    assert a.sync_compression == "none"
    a, _, seeds = parse_args(["--seeds", "1", "--sync-compression", "fp16", "--target", "0.9"])
    assert seeds == [0] and a.sync_compression == "fp16" and a.target_accuracy == 0.9


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--links", "0"], "--links: '0': each bandwidth"),
        (["--links", ","], "--links: ',': each bandwidth"),
        (["--repeat", "0"], "--repeat: at least 1"),
        (["--seeds", "0"], "--seeds: at least 1"),
        (["--target-accuracy", "95"], "--target-accuracy: a fraction in (0, 1]"),
        (["--recipe", "gpt", "--target-accuracy", "0.9"], "--target-accuracy: test accuracy,"),
        (["--recipe", "gpt"], "--target-val-loss: a token recipe (gpt) needs it"),
        (["--target-val-loss", "2.5"], "--target-val-loss: only for a token recipe"),
    ],
)
def test_the_benchmark_refuses_in_one_line_before_anything_starts(flags, line, monkeypatch):
    import benchmarks.diloco as bench

    monkeypatch.setattr(bench, "digits_workspace", None)  # nothing may start
    with pytest.raises(ConfigError) as e:
        bench.main(flags)
    assert str(e.value).startswith(line) and "\n" not in str(e.value)


def test_a_16_bit_sync_setting_outside_the_choices_is_refused_naming_the_flag(capsys):
    from hetflow.cli.args import UsageError

    from benchmarks.diloco import parse_args

    with pytest.raises((UsageError, SystemExit)) as e:
        parse_args(["--sync-compression", "powersgd:4"])
    assert "--sync-compression" in str(e.value) + capsys.readouterr().err


def test_the_benchmark_measures_gpt_by_val_loss_and_the_digits_by_accuracy():
    from benchmarks.diloco import targets

    assert targets(None, 2.5, tokens=True) == {"target_accuracy": None, "target_val_loss": 2.5}
    assert targets(None, None, tokens=False) == {"target_accuracy": 0.95}
    assert targets(0.9, None, tokens=False) == {"target_accuracy": 0.9}


def test_every_seeds_rounds_rotate_which_variant_runs_first():
    from benchmarks.diloco import schedule

    plan = schedule(["sync", "diloco"], seeds=[0, 1, 2], repeat=2)
    assert [(r, s) for r, s, _ in plan] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    firsts = [order[0] for _, _, order in plan]
    assert firsts.count("sync") == firsts.count("diloco") == 3
    assert all(sorted(order) == ["diloco", "sync"] for _, _, order in plan)


def run(seed, t, q, round_=0, bytes_=1000.0, key="final_accuracy"):
    return {
        "seed": seed,
        "round": round_,
        "position": 0,
        "end_to_end_time_to_target_s": t,
        key: q,
        "bytes_per_sample": bytes_,
        "wait_fraction": 0.5,
        "trials_s": 0.0,
        "end_to_end_s": 50.0,
    }


def test_speed_ups_are_paired_by_seed_and_quality_is_spread_across_seeds():
    rows = {
        0.1: {
            "sync": [run(0, 40.0, 0.98), run(1, 60.0, 0.96), run(2, 50.0, 0.97)],
            "diloco": [run(0, 20.0, 0.97), run(1, 20.0, 0.96), run(2, None, 0.90, bytes_=100.0)],
        }
    }
    d = summarize_links(rows)[0.1]["diloco"]
    assert d["reached"] == 2 and d["runs"] == 3
    assert d["end_to_end_time_to_target_s"] == 20.0
    # 40/20 and 60/20 in their own seeds, not the median against the median (50 / 20)
    assert d["speedup_vs_sync"] == 2.5 and d["speedup_vs_sync_range"] == [2.0, 3.0]
    assert d["final_accuracy_by_seed"] == [0.97, 0.96, 0.90]
    assert d["final_accuracy"] == 0.96 and d["final_accuracy_range"] == [0.90, 0.97]
    # against sync's of the same seed: -1.0%, 0, -7.2%
    assert d["quality_change_vs_sync"] == pytest.approx((0.97 - 0.98) / 0.98)
    assert d["quality_change_vs_sync_range"] == pytest.approx([(0.90 - 0.97) / 0.97, 0.0])
    assert d["bytes_per_sample_range"] == [100.0, 1000.0]
    s = summarize_links(rows)[0.1]["sync"]
    assert s["speedup_vs_sync"] == 1.0 and s["quality_change_vs_sync"] == 0.0


def test_a_seeds_rounds_give_it_one_quality_their_median():
    rows = {1.0: {"sync": [run(0, 10.0, 0.9, r) for r in range(2)] + [run(0, 10.0, 0.96, 2)]}}
    s = summarize_links(rows)[1.0]["sync"]
    assert s["final_accuracy_by_seed"] == [0.9] and s["final_accuracy_range"] == [0.9, 0.9]


def test_the_table_shows_medians_with_their_spread_and_val_loss_for_gpt():
    key = "final_val_loss"
    rows = {
        0.1: {
            "sync": [run(0, 40.0, 2.5, key=key), run(1, 44.0, 2.6, key=key)],
            "diloco": [run(0, 20.0, 2.51234, key=key), run(1, 22.0, 2.6, key=key)],
        }
    }
    text = table(summarize_links(rows))
    assert "| final val_loss (across seeds) |" in text
    assert "| 0.1 Gbit/s | diloco | 21.0 (20.0-22.0) | 2.00x | 2.5562 (2.5123-2.6000) |" in text
    assert "| not reached |" not in text


def test_a_classifiers_test_loss_is_its_finer_quality_beside_its_accuracy():
    def with_loss(seed, t, acc, loss):
        return run(seed, t, acc) | {"final_test_loss": loss}

    rows = {
        0.1: {
            "sync": [with_loss(0, 40.0, 0.98, 0.100), with_loss(1, 44.0, 0.97, 0.120)],
            "diloco": [with_loss(0, 20.0, 0.98, 0.105), with_loss(1, 22.0, 0.97, 0.114)],
        }
    }
    d = summarize_links(rows)[0.1]["diloco"]
    # equal accuracy, and the loss tells them apart: +5% on seed 0, -5% on seed 1
    assert d["quality_change_vs_sync"] == 0.0
    assert d["final_test_loss_by_seed"] == [0.105, 0.114]
    assert d["test_loss_change_vs_sync_range"] == pytest.approx([-0.05, 0.05])
    text = table(summarize_links(rows))
    header = "| final accuracy (across seeds) | vs sync | test loss (across seeds) | vs sync |"
    assert header in text
    assert "| 0.1095 (0.1050-0.1140) |" in text and "0.00% (-5.00% to +5.00%) |" in text


def test_the_progress_line_says_the_seed_the_place_in_the_round_and_not_reached_in_words():
    fig = run(1, None, 0.81111) | {"position": 1, "bytes_per_sample": 1773.2}
    assert progress_line(0.1, "diloco", 0, fig) == (
        "0.1 Gbit/s diloco #0 seed 1 (ran #2): to target not reached, accuracy 0.811, "
        "bytes/sample 1773"
    )
    fig["end_to_end_time_to_target_s"] = 41.26
    assert "to target 41.3 s," in progress_line(0.1, "sync", 0, fig)
    gpt = run(0, 20.0, 2.51234, key="final_val_loss") | {"final_accuracy": None}
    assert ", val_loss 2.5123, " in progress_line(0.1, "diloco", 0, gpt)


def test_a_spread_too_narrow_to_show_is_left_out_and_a_signed_one_reads_a_to_b():
    from benchmarks.diloco_figures import spread

    assert spread({"w": 0.881, "w_range": [0.879, 0.882]}, "w", ".2f") == "0.88"
    row = {"q": -0.01, "q_range": [-0.072, 0.0]}
    assert spread(row, "q", "+.2%") == "-1.00% (-7.20% to +0.00%)"
    assert spread({}, "q", ".2f") == "-"
