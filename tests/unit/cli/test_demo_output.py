"""The demo's final printing: the table with its notes, the MLflow runs one a line,
and nothing of Prefect's after "Where to look"; `hetflow compare` prints the notes too."""

from __future__ import annotations

import logging

import pytest

from hetflow.cli import main
from hetflow.cli.commands import _print_runs, _print_table
from hetflow.infra.report.notes import notes
from hetflow.infra.report.table import comparison

from tests.run_records import CLUSTER, EQUAL, figures_of, run_of

BASELINE = figures_of(run_of([[32] * 4] * 6, 0.2), CLUSTER, EQUAL)
OPTIMIZED = figures_of(run_of([[8, 8, 32, 80]] * 6, 0.1), CLUSTER, EQUAL)


def test_the_table_is_followed_by_its_notes(capsys):
    table = comparison(BASELINE, OPTIMIZED, target_accuracy=0.95)
    _print_table(table, "t", notes(BASELINE, OPTIMIZED))
    out = " ".join(capsys.readouterr().out.split())  # the notes wrap, as the table
    assert "time_to_target_s (accuracy ≥ 95.0%)" in out and "not reached" in out
    assert "rank0/local_batch (last step)" in out
    legend = out.index("percentage")
    assert out.index("- comm_fraction rose from 5.0% to 10.0%") > legend


def test_the_runs_are_a_list_not_a_dict(capsys):
    _print_runs("p" * 32, {"baseline": "b" * 32, "optimized": "o" * 32})
    assert capsys.readouterr().out.splitlines() == [
        "MLflow runs:",
        f"  compare    {'p' * 32}  (parent)",
        f"  baseline   {'b' * 32}",
        f"  optimized  {'o' * 32}",
        f"  the table again: hetflow compare {'b' * 32} {'o' * 32}",
    ]


def test_prefects_stop_line_is_kept_off_the_console_and_its_other_lines_not():
    from hetflow.cli.logs import ConsoleFilter

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("prefect", logging.INFO, __file__, 1, message, (), None)

    keep = ConsoleFilter().filter
    assert not keep(record("Stopping temporary server on http://127.0.0.1:8665"))
    assert keep(record("Starting temporary server on http://127.0.0.1:8665"))
    assert keep(record("something else"))


@pytest.fixture
def two_runs(hetflow_home) -> tuple[str, str]:
    """A baseline and an optimized run in the default store, with the figures a run records;
    the optimized one without w0, w1 and w2 (one worker: no all-reduce)."""
    from hetflow.config import TrackingConfig
    from hetflow.infra.tracking.tracker import MLflowTracker
    from hetflow.records import Plan

    alone = Plan.equal([0, 0, 0, 128]).model_copy(update={"dropped": ["w0", "w1", "w2"]})
    figures = {
        "baseline": BASELINE,
        "optimized": figures_of(run_of([[128]] * 6, 0.05), CLUSTER, alone),
    }
    tracker = MLflowTracker(TrackingConfig())
    ids = []
    for variant, m in figures.items():
        run_id = tracker.client.create_run(
            tracker.experiment_id(), tags={"variant": variant}
        ).info.run_id
        tracker.log_metrics(run_id, m)
        tracker.finish(run_id)
        ids.append(run_id)
    return ids[0], ids[1]


def test_compare_from_mlflow_notes_the_workers_a_run_went_without(two_runs, capsys):
    assert main(["compare", *two_runs]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the notes wrap, as the table
    assert "- optimized ran without 3 of its 4 workers: rank0 at batch 0" in out
    assert "no all-reduce" in out and "compare one worker's run with 4 workers'" in out
