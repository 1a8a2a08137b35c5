"""`hetflow bench hetero`'s pure pieces and argument checks (the benchmark itself is measured,
not tested)."""

from __future__ import annotations

import pytest

from benchmarks.hetero import main


@pytest.mark.slow
def test_keep_results_writes_every_ranks_step_records_of_each_run(tmp_path, hetflow_home):
    """A real bench run (2 emulated workers, 3 steps): --keep-results leaves each run's
    result.json beside its first plan, so that a run can be read step by step afterwards."""
    import json

    keep = tmp_path / "runs"
    # baseline: the equal split launches both workers, whatever the profile reads
    argv = ["--speeds", "1,2", "--steps", "3", "--global-batch", "32", "--variants", "baseline"]
    main([*argv, "--keep-results", str(keep), "--json", str(tmp_path / "x.json")])
    saved = json.loads((keep / "baseline-0.json").read_text())
    ranks = saved["result"]["ranks"]
    assert len(ranks) == len(saved["plan"]["local_batches"]) == 2
    for r in ranks:
        batches = [x["batch"] for x in r["records"]]
        assert batches == [saved["plan"]["local_batches"][r["rank"]]] * 3
        assert all(x["compute_s"] > 0 for x in r["records"])


@pytest.mark.slow
def test_the_bound_times_each_worker_alone_at_the_batches_the_plans_gave_it(
    tmp_path, hetflow_home, capsys
):
    """--bound: after the round, each worker of the equal split runs alone at its share (16
    samples), and the variant's efficiency is its throughput over the sum of those rates."""
    import json

    argv = ["--speeds", "1,2", "--steps", "3", "--global-batch", "32", "--variants", "baseline"]
    main([*argv, "--bound", "--json", str(tmp_path / "x.json")])
    printed = capsys.readouterr().out
    assert "bound: w0 alone at batch 16" in printed and "bound: w1 alone at batch 16" in printed
    run = json.loads((tmp_path / "x.json").read_text())["variants"]["baseline"]
    assert run["bound_samples_per_s"] == run["plan_bound_samples_per_s"] > 0
    assert run["efficiency_vs_bound"] == pytest.approx(
        run["throughput_samples_per_s"] / run["bound_samples_per_s"]
    )
