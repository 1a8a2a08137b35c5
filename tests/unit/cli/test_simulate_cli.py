"""`hetflow simulate` end to end (no calibration runs): JSON shape, plot, bad input."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from hetflow.cli.simulate import main
from hetflow.records import Profile, RankProfile

from benchmarks.calibrate import calibration_errors, measured_run, predict_run


def test_profile_cluster_and_published_tables(tmp_path, capsys):
    profile = {
        "cluster": "c4",
        "model": "cnn",
        "ranks": [
            {
                "rank": i,
                "worker": f"w{i}",
                "fit_latency_s": 0.01 * s,
                "fit_s_per_sample": 0.003 / s,
                "samples_per_s": 300 * s,
                "step_compute_s": 0.01 * s + 0.096 / s,
                "allreduce_gbps": 10.0,
                "allreduce_latency_s": 0.001,
            }
            for i, s in enumerate([1, 1, 2, 4])
        ],
    }
    src = tmp_path / "profile.json"
    src.write_text(json.dumps(profile))
    path = tmp_path / "out.json"
    assert (
        main(["--cluster", str(src), "--workers", "4,64", "--published", "--json", str(path)]) == 0
    )
    out = json.loads(path.read_text())
    assert {(r["workers"], r["plan"]) for r in out["rows"]} == {
        (n, p) for n in (4, 64) for p in ("baseline", "optimized")
    }
    assert out["model"]["name"] == "cnn"
    four = {r["plan"]: r for r in out["rows"] if r["workers"] == 4}
    assert four["optimized"]["speedup_vs_baseline"] > 1.2
    pub = out["published"]
    assert {r["role"] for r in pub["rows"]} == {"c", "alpha", "link", "held out"}
    assert pub["held_out_rows"] == sum(r["role"] == "held out" for r in pub["rows"])
    printed = capsys.readouterr().out
    assert (
        f"held-out error (rows not fitted): max {pub['held_out_max_abs_error']:.1%}" in printed
    )  # the figure printed is the one computed


def _profile(latency, per_sample):
    return Profile(
        cluster="test",
        model="cnn",
        ranks=[
            RankProfile(
                rank=i,
                fit_latency_s=a,
                fit_s_per_sample=c,
                samples_per_s=1 / c,
                step_compute_s=a + 32 * c,
                allreduce_gbps=100.0,
                allreduce_latency_s=0.0,
            )
            for i, (a, c) in enumerate(zip(latency, per_sample, strict=True))
        ],
    )


def _measured(prof, model, batches, plan, overhead_s):
    true = predict_run(prof, model, 128, batches, plan, overhead_s=overhead_s)
    return {
        "profile": prof,
        "model": model,
        "global_batch": 128,
        "batches": batches,
        "plan": plan,
        "measured": {
            "throughput_samples_per_s": true.throughput_samples_per_s,
            "step_time_s": true.step_time_s,
            "compute_s": [],
            "comm_s": 0.0,
        },
    }


def test_calibration_fits_the_overhead_leave_one_out():
    prof = _profile([0.02, 0.02, 0.01, 0.005], [0.004, 0.004, 0.002, 0.001])
    comm_prof = _profile([0.0] * 4, [0.003] * 4)
    # one overhead for every run: leave-one-out recovers it and predicts every run exactly
    runs = {
        name: _measured(prof, "cnn", batches, name, 0.015)
        for name, batches in (("baseline", [32] * 4), ("optimized", [16, 16, 32, 64]))
    }
    runs["comm"] = _measured(comm_prof, "wide_mlp", [32] * 4, "baseline", 0.015)
    cal = calibration_errors(runs)
    assert cal["step_overhead_s"] == pytest.approx(0.015)
    assert cal["hetero_error"] == pytest.approx(0.0, abs=1e-9)
    assert cal["comm_error"] == pytest.approx(0.0, abs=1e-9)
    assert cal["hetero_error_profile_only"] > 0.05
    assert set(cal["runs"]) == {"baseline", "optimized", "comm"}
    # different overheads: each hetero run is predicted with the other's, comm with their mean
    runs = {
        "baseline": _measured(prof, "cnn", [32] * 4, "baseline", 0.010),
        "optimized": _measured(prof, "cnn", [16, 16, 32, 64], "optimized", 0.020),
        "comm": _measured(comm_prof, "wide_mlp", [32] * 4, "baseline", 0.015),
    }
    used = {k: r["overhead_used_s"] for k, r in calibration_errors(runs)["runs"].items()}
    assert used == pytest.approx({"baseline": 0.020, "optimized": 0.010, "comm": 0.015})


def test_a_training_result_is_measured_after_its_first_step():
    def rank(r, step_s, compute_s, comm_s):
        records = [
            {
                "step": i,
                "batch": 64,
                "data_s": 0.0,
                "compute_s": c,
                "wait_s": 0.0,
                "step_s": t,
                "loss_sum": 1.0,
                "bytes_sent": 0.0,
                "comm_s": m,
            }
            for i, (t, c, m) in enumerate(zip(step_s, compute_s, comm_s, strict=True))
        ]
        return {"rank": r, "records": records, "plans": [{"step": 0, "plan": [64, 64]}]}

    result = {
        "mode": "train",
        "ranks": [
            rank(1, [1.0, 0.5, 0.5], [0.8, 0.2, 0.2], [0.0] * 3),
            rank(0, [1.0, 0.5, 0.5], [0.9, 0.3, 0.5], [0.1, 0.1, 0.2]),
        ],
    }
    m = measured_run(result, 128)
    assert m["throughput_samples_per_s"] == pytest.approx(256.0)  # 2 x 128 samples in 1 s
    assert m["step_time_s"] == pytest.approx(0.5)
    assert m["compute_s"] == pytest.approx([0.4, 0.2])  # rank order
    assert m["comm_s"] == pytest.approx(0.15)
    with pytest.raises(ValidationError):
        measured_run({"mode": "profile", "ranks": result["ranks"]}, 128)
