"""`hetflow bench comm` end to end, small: 2 methods, a few steps, the small MLP."""

from __future__ import annotations

import json

import pytest

from hetflow.config import TrainConfig
from hetflow.records import CompressionMethod, MethodTrial
from hetflow.training.comm import ring_allreduce_bytes
from hetflow.training.plan.compression import choose_from_trials

from benchmarks.comm import main

KEYS = {
    "bytes_per_step",
    "compression_ratio",
    "step_time_s",
    "comm_time_s",
    "final_accuracy",
    "accuracy_delta_pp",
}


@pytest.mark.slow
def test_bench_comm_smoke(s3, tmp_path, capsys):
    out = tmp_path / "comm.json"
    argv = [
        "--methods",
        "none,fp16",
        "--steps",
        "3",
        "--recipe",
        "digits-mlp",
        "--link-gbps",
        "1",
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    assert set(data["methods"]) >= {"none", "fp16"}
    # chosen by trials, as 'auto' chooses (the first unless another is shorter beyond the
    # trials' noise: `choose_from_trials`), and trained too
    assert data["chosen_by"] == "trials" and data["chosen"] in data["methods"]
    assert [t["method"] for t in data["trials"]] == list(TrainConfig().compression_candidates)
    table = [
        MethodTrial.model_validate(t | {"method": CompressionMethod.parse(t["method"])})
        for t in data["trials"]
    ]
    assert all(t.spread_s >= 0 for t in table) and any(t.spread_s > 0 for t in table)
    assert data["chosen"] == str(choose_from_trials(table)[0])
    for name, m in data["methods"].items():
        assert KEYS <= set(m), name
    none, fp16 = data["methods"]["none"], data["methods"]["fp16"]
    assert none["bytes_per_step"] == ring_allreduce_bytes(4 * data["params"], 4)
    assert fp16["bytes_per_step"] == none["bytes_per_step"] / 2
    assert fp16["compression_ratio"] == 2.0 and none["compression_ratio"] == 1.0
    assert none["accuracy_delta_pp"] == 0.0
    printed = capsys.readouterr().out
    assert "compression ratio" in printed and "accuracy loss" in printed  # the survey-shaped table
    assert f"auto on this link: {data['chosen']} (by trials' steps: none " in printed
