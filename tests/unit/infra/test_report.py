"""The comparison table's cells, labels, change column and notes, the UI links, the plots' rank
labels (pure)."""

from __future__ import annotations

import pytest

from hetflow.config import ClusterSpec, WorkerSpec
from hetflow.infra.report.notes import notes, workers_left
from hetflow.infra.report.plots import rank_labels, same_lines
from hetflow.infra.report.table import (
    LEGEND,
    change,
    comparison,
    fmt,
    headline,
    markdown,
    rows,
    summary,
    unit,
)
from hetflow.infra.tracking import links
from hetflow.records import Plan, Profile, RankProfile

from tests.run_records import CLUSTER, EQUAL, figures_of, run_of

BASELINE = {
    "throughput_samples_per_s": 400.0,
    "train_loop_s": 9.6,
    "time_to_target_s": 8.0,
    "final_accuracy": 0.95,
    "comm_bytes_total": 726_300_000.0,
    "data_wait_fraction": 0.003,
    "straggler_idle_fraction": 0.41,
    "steps": 30,
    "rank0/busy_fraction": 0.9,
    "rank0/local_batch": 32,
    "rank1/busy_fraction": 0.3,
    "rank1/local_batch": 32.0,
}
OPTIMIZED = {
    **BASELINE,
    "throughput_samples_per_s": 1000.0,
    "time_to_target_s": 4.0,
    "final_accuracy": 0.96,
    "comm_bytes_total": 2_100_000_000.0,
    "data_wait_fraction": 0.008,
    "straggler_idle_fraction": 0.05,
    "rank0/local_batch": 16,
    "rank1/local_batch": 48,
}


def test_cells_carry_units_counts_are_whole_and_fractions_are_percent():
    by_name = {m: (a, b, c) for m, a, b, c in rows(comparison(BASELINE, OPTIMIZED))}
    # 32.0 from MLflow is 32; with no start plan known, the batch is the last step's
    assert by_name["rank1/local_batch (last step)"] == ("32", "48", "+50.0%")
    assert by_name["comm_bytes_total"][:2] == ("726.3 MB", "2.1 GB")
    assert by_name["train_loop_s"][0] == "9.60 s"
    assert by_name["throughput_samples_per_s"] == ("400 samples/s", "1000 samples/s", "+150.0%")
    assert by_name["final_accuracy"][:2] == ("95.0%", "96.0%")


def test_fractions_change_in_percentage_points_not_relative_percent():
    by_name = {m: c for m, _, _, c in rows(comparison(BASELINE, OPTIMIZED))}
    assert by_name["data_wait_fraction"] == "+0.5 pp"  # relative: +166.7%
    assert by_name["straggler_idle_fraction"] == "-36.0 pp"
    assert by_name["final_accuracy"] == "+1.0 pp"
    assert by_name["rank0/busy_fraction"] == "+0.0 pp"
    assert by_name["time_to_target_s"] == "-50.0%"


@pytest.mark.parametrize(
    ("value", "name", "cell"),
    [
        (None, "train_loop_s", "-"),
        (512.0, "comm_bytes_per_step", "512 B"),
        (4_500.0, "rank2/comm_bytes", "4.5 kB"),
        (3.2e12, "s3_bytes_read", "3.2 TB"),
        (0.0421, "train_loop_s", "0.042 s"),
        (123.4, "time_to_target_s", "123 s"),
        (2.5, "cost_usd", "$2.50"),
        (12.34, "rank3/samples_per_s", "12.3 samples/s"),
        (1.0, "cache_hit_ratio", "100.0%"),
        (7.0, "replans", "7"),
        (float("nan"), "final_accuracy", "nan"),
        (7.263e8, "", "7.263e+08"),  # no name: the plain number, as before
        (3.14159, "loss", "3.142"),
    ],
)
def test_fmt(value, name, cell):
    assert fmt(value, name) == cell


def test_unit_reads_the_name_after_the_rank_prefix():
    assert unit("rank3/local_batch") == "count" and unit("local_batch") == "count"
    assert unit("rank3/busy_fraction") == "fraction"
    assert unit("throughput_samples_per_s") == "rate"  # not seconds, though it ends in _s


def test_change_is_a_dash_where_there_is_nothing_to_compare():
    assert change(None, 0.5, "busy_fraction") == "-"
    assert change(0.0, 5.0, "train_loop_s") == "-"
    assert change(2.0, None, "train_loop_s") == "-"


def test_headline_has_both_variants_and_ratios_optimized_over_baseline():
    h = headline(BASELINE, OPTIMIZED)
    assert h["baseline/throughput_samples_per_s"] == 400.0
    assert h["optimized/straggler_idle_fraction"] == 0.05
    assert h["speedup"] == pytest.approx(2.5)
    assert h["time_to_target_ratio"] == pytest.approx(0.5)
    assert h["comm_bytes_ratio"] == pytest.approx(2_100_000_000 / 726_300_000)
    assert "cost_ratio" not in h and "baseline/cost_usd" not in h  # no prices, no cost
    assert not any(k.startswith(("baseline/rank", "optimized/rank")) for k in h)
    no_target = headline({**BASELINE, "time_to_target_s": None}, OPTIMIZED)
    assert "time_to_target_ratio" not in no_target
    assert "2.50x the baseline throughput" in summary(h)


def test_markdown_has_the_same_rows_a_legend_and_what_comes_before_and_after():
    table = comparison(BASELINE, OPTIMIZED)
    md = markdown(table, "t", before="SUMMARY", after="- LINKS")
    lines = md.splitlines()
    assert lines[0] == "### t" and lines.index("SUMMARY") < lines.index(
        "| metric | baseline | optimized | change |"
    )
    body = [line for line in lines if line.startswith("| ") and not line.startswith("| metric")]
    assert body == [f"| {m} | {a} | {b} | {c} |" for m, a, b, c in rows(table)]
    assert "percentage points (pp)" in md and md.rstrip().endswith("- LINKS")


def test_links_for_a_server_and_for_a_sqlite_store():
    served = links.links_markdown(
        "http://127.0.0.1:5050",
        "7",
        {"compare": "p", "baseline": "b", "optimized": "o"},
        "http://prefect/runs/flow-run/x",
    )
    assert (
        "- compare: [p](http://127.0.0.1:5050/#/experiments/7/runs/p?workflowType=machine_learning)"
        in served
    )
    assert "[`" not in served  # a link's text is plain: Prefect's page showed the backticks
    assert "mlflow ui" not in served and "http://prefect/runs/flow-run/x" in served
    assert "compare-runs?runs=%5B%22b%22%2C%22o%22%5D&experiments=%5B%227%22%5D" in served
    local = links.links_markdown("sqlite:////h/mlflow.db", "1", {"compare": "p"})
    assert "`mlflow ui --backend-store-uri sqlite:////h/mlflow.db --port 5000`" in local
    assert "http://127.0.0.1:5000/#/experiments/1/runs/p?workflowType=machine_learning" in local


def test_rank_labels_name_the_worker_its_speed_and_the_measured_speed():
    cluster = ClusterSpec.from_speeds([1, 4])
    profile = Profile(
        cluster="c",
        model="digits-mlp",
        ranks=[
            RankProfile(
                rank=r,
                samples_per_s=s,
                step_compute_s=0.1,
                fit_latency_s=0.0,
                fit_s_per_sample=0.01,
                relative_speed=s / 400,
            )
            for r, s in enumerate((104.0, 400.0))
        ],
    )
    assert rank_labels(cluster, profile) == ["w0 · 1x (measured 0.26)", "w1 · 4x (measured 1.00)"]
    cloud = ClusterSpec(workers=[WorkerSpec(name="g5-a", instance_type="g5.xlarge")], emulate=False)
    assert rank_labels(cloud) == ["g5-a · g5.xlarge"]


def test_equal_lines_are_drawn_once_and_named_together():
    groups = same_lines({"w0": [32, 32], "w1": [32, 32], "w2": [32, 32], "w3": [32, 32]})
    assert groups == [(["w0", "w1", "w2", "w3"], [32, 32])]
    assert len(same_lines({"w0": [16, 20], "w1": [48, 44]})) == 2


# -- a table that explains itself, from run records as the workers return them ----


def test_a_replanned_local_batch_shows_the_start_plan_and_the_end_plan():
    base = figures_of(run_of([[32] * 4] * 6, 0.2), CLUSTER, EQUAL)
    start = Plan.equal([8, 8, 32, 80])
    opt = figures_of(run_of([[8, 8, 32, 80]] * 3 + [[10, 9, 32, 77]] * 3, 0.1), CLUSTER, start)
    table = comparison(
        base, opt, start_batches={"baseline": EQUAL.local_batches, "optimized": [8, 8, 32, 80]}
    )
    by_label = {m: (a, b) for m, a, b, _ in rows(table)}
    assert by_label["rank0/local_batch (start plan)"] == ("32", "8")  # what the log said
    assert by_label["rank0/local_batch (end plan)"] == ("32", "10")  # the last step's
    assert by_label["rank3/local_batch (end plan)"] == ("32", "77")
    assert not any(m.startswith("rank0/local_batch") and "plan)" not in m for m in by_label)
    # the JSON keeps the names: the start plan beside the last step's batch
    assert table["optimized"]["rank1/start_local_batch"] == 8
    assert table["optimized"]["rank1/local_batch"] == 9
    # no re-plan changed a batch: one row a worker, saying so
    same = comparison(
        base,
        figures_of(run_of([[8, 8, 32, 80]] * 6, 0.1), CLUSTER, start),
        start_batches={"baseline": EQUAL.local_batches, "optimized": [8, 8, 32, 80]},
    )
    labels = [m for m, _, _, _ in rows(same) if "local_batch" in m]
    assert labels == [f"rank{r}/local_batch (start = end plan)" for r in range(4)]


def test_a_target_not_reached_is_said_with_the_target_not_left_out():
    base = figures_of(run_of([[32] * 4] * 6, 0.2, accuracies=(0.5, 0.8)), CLUSTER, EQUAL)
    opt = figures_of(run_of([[8, 8, 32, 80]] * 6, 0.1, accuracies=(0.9, 0.97)), CLUSTER, EQUAL)
    assert "time_to_target_s" not in base and opt["time_to_target_s"] == pytest.approx(0.6)
    table = comparison(base, opt, target_accuracy=0.95)
    by_label = {m: (a, b, c) for m, a, b, c in rows(table)}
    assert by_label["time_to_target_s (accuracy ≥ 95.0%)"] == ("not reached", "0.600 s", "-")
    assert table["baseline"]["time_to_target_s"] is None  # the JSON: None, the row kept
    assert table["optimized"]["target_accuracy"] == 0.95
    assert "target_accuracy" not in by_label  # stated in the label, not as a row of its own
    # neither reached it: the row is still there
    neither = comparison(base, base, target_accuracy=0.99)
    cells = {m: (a, b) for m, a, b, _ in rows(neither)}
    assert cells["time_to_target_s (accuracy ≥ 99.0%)"] == ("not reached", "not reached")
    md = markdown(neither, "t")
    assert "| time_to_target_s (accuracy ≥ 99.0%) | not reached | not reached | - |" in md
    # no target set: no row timed to one
    assert "time_to_target_s" not in {m for m, _, _, _ in rows(comparison(base, base))}


def test_a_loss_target_is_named_by_its_figure():
    table = comparison({"final_val_loss": 3.1}, {"final_val_loss": 2.4}, target_val_loss=2.5)
    assert rows(table)[0] == ("time_to_target_s (val_loss ≤ 2.500)", *("not reached",) * 2, "-")


def test_a_variant_that_ran_on_fewer_workers_gets_a_note_saying_which_and_why():
    why = "w0: its step of 0.082 s at 8 samples is at least the 0.081 s step the others take"
    plan = Plan.equal([0, 0, 0, 128]).model_copy(
        update={"excluded": [why, "w1: same", "w2: same"], "dropped": ["w0", "w1", "w2"]}
    )
    base = figures_of(run_of([[32] * 4] * 6, 0.2), CLUSTER, EQUAL)
    opt = figures_of(run_of([[128]] * 6, 0.05), CLUSTER, plan)  # launched: w3 alone
    assert opt["comm_bytes_total"] == 0 and opt["rank0/local_batch"] == 0
    left = {
        "baseline": workers_left(EQUAL.excluded, EQUAL.dropped, {}),
        "optimized": workers_left(plan.excluded, plan.dropped, {}),
    }
    said = notes(base, opt, left)
    assert len(said) == 1, said
    assert said[0].startswith("optimized ran without 3 of its 4 workers: w0 not launched: its")
    assert "no all-reduce" in said[0] and "compare one worker's run with 4" in said[0]
    # from MLflow's figures alone (hetflow compare): the workers at batch 0, still said
    alone = notes(base, opt)
    assert alone[0].startswith("optimized ran without 3 of its 4 workers: rank0 at batch 0")
    # a node lost during the run, and a worker kept at batch 0
    lost = workers_left(["w2: slow"], [], {"w1": "node lost"})
    assert lost == {
        "w2": "at batch 0 from the start, kept in the all-reduce: slow",
        "w1": "lost during the run: node lost",
    }
    md = markdown(comparison(base, opt), "t", notes=said, after="LINKS")
    assert f"\n- {said[0]}\n" in md and md.index(LEGEND) < md.index(said[0]) < md.index("LINKS")


def test_a_rise_in_the_share_of_communication_says_why():
    # the same 10 ms all-reduce each step; the optimized step is half as long (no straggler)
    base = figures_of(run_of([[32] * 4] * 6, 0.2, comm_s=0.01), CLUSTER, EQUAL)
    opt = figures_of(run_of([[8, 8, 32, 80]] * 6, 0.1, comm_s=0.01), CLUSTER, EQUAL)
    assert opt["comm_fraction"] > base["comm_fraction"]
    (note,) = notes(base, opt)
    assert note.startswith("comm_fraction rose from 5.0% to 10.0% although each step's")
    assert "10.0 ms to 10.0 ms per worker" in note and "200.0 ms to 100.0 ms" in note
    # communication that itself took longer is said so, with the bytes
    slower = figures_of(run_of([[8, 8, 32, 80]] * 6, 0.1, comm_s=0.03), CLUSTER, EQUAL)
    (note,) = notes(base, slower)
    assert "took longer (10.0 ms to 30.0 ms per worker; 4.0 MB to 4.0 MB sent per step)" in note
    assert notes(opt, base) == []  # it fell: nothing to explain
