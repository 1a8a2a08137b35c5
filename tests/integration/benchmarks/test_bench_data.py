"""`hetflow bench data`, small, against the moto S3 over HTTP: JSON shape and what must hold."""

from __future__ import annotations

import json

import pytest

from hetflow.cli import main as cli_main

SMALL = [
    "--s3-latency-ms",
    "20",
    "--s3-mbps",
    "0",
    "--epochs",
    "2",
    "--steps-per-epoch",
    "16",
    "--shard-samples",
    "32",
    "--plan",
    "8,8",
    "--compute-ms",
    "5",
    "--prefetch",
    "3",
    "--cache-mb",
    "1",
]


def test_bench_data_smoke(s3, tmp_path):
    path = tmp_path / "data.json"
    assert cli_main(["bench", "data", *SMALL, "--json", str(path)]) == 0
    out = json.loads(path.read_text())
    assert set(out["variants"]) == {"no_cache", "cache", "cache_prefetch", "cache_half"}
    for variant in out["variants"].values():
        assert len(variant["epochs"]) == 2
        for ep in variant["epochs"]:
            assert {"s3_bytes_read", "cache_hit_ratio", "data_wait_fraction"} <= set(ep)
            assert 0 <= ep["cache_hit_ratio"] <= 1 and 0 <= ep["data_wait_fraction"] <= 1
    share = out["share_bytes"]
    assert out["shards"] == out["share_shards"] == 8  # 256 samples in shards of 32
    v = out["variants"]
    # The share fits the budget: the first epoch reads it once, later epochs read nothing.
    for name in ("cache", "cache_prefetch"):
        assert [ep["s3_bytes_read"] for ep in v[name]["epochs"]] == [share, 0]
    assert v["cache"]["epochs"][1]["cache_hit_ratio"] == 1.0
    # Without a cache every epoch goes to S3 again; the model of its reads is exact.
    for ep in v["no_cache"]["epochs"]:
        assert ep["s3_bytes_read"] == ep["expected_bytes"] >= share
        assert ep["cache_hit_ratio"] == 0.0
    # Half the share as budget: what an LRU of that size reads, and within its bound.
    half = v["cache_half"]
    assert half["budget_bytes"] == share // 2
    for ep in half["epochs"]:
        assert ep["s3_bytes_read"] == ep["expected_bytes"]
    assert share - half["budget_bytes"] <= half["epochs"][1]["s3_bytes_read"] <= share
    assert out["goals"]["cache_later_epochs_read_0_bytes"]
    assert out["goals"]["cache_half_reads_equal_lru_model"]
    # A ratio with a wide margin, not a time: no_cache waits ~2/3 of each step on a 20 ms S3.
    # On a host loaded by other processes (another test file's ranks beside it) prefetch's
    # lead shrinks (to 1.7x at the least seen), so the margin asked for is 1.3x.
    wait = {k: v[k]["epochs"][1]["data_wait_fraction"] for k in v}
    assert wait["no_cache"] > 1.3 * wait["cache_prefetch"]


def test_train_mode_figures_come_from_the_step_records_epoch_by_epoch():
    from hetflow.records import CacheCounts, PlanChange, RankResult, RunResult, StepRecord

    from benchmarks.data_train import epoch_figures

    def rank(r: int, waits: list[float], s3: list[int]) -> RankResult:
        recs = [
            StepRecord(
                step=t,
                batch=8,
                data_s=w,
                compute_s=0.0,
                wait_s=0.0,
                step_s=1.0,
                loss_sum=0.0,
                bytes_sent=0.0,
                s3_bytes=b,
            )
            for t, (w, b) in enumerate(zip(waits, s3, strict=True))
        ]
        return RankResult(
            rank=r, records=recs, plans=[PlanChange(step=0, plan=[8, 8])], cache=CacheCounts()
        )

    res = RunResult(
        ranks=[
            rank(0, [0.5, 0.1, 0.0, 0.0], [9, 1, 0, 0]),
            rank(1, [0.3, 0.1, 0.02, 0.0], [0, 0, 0, 0]),
        ]
    )
    epochs = epoch_figures(res, steps_per_epoch=2)
    assert [e["s3_bytes_read"] for e in epochs] == [10, 0]
    assert [e["data_wait_fraction"] for e in epochs] == pytest.approx([1.0 / 4, 0.02 / 4])
