"""A rank streams its share of each step: token windows, exactly once per epoch across re-plans
and restarts, bounded memory, and a real training run that reads through the cache."""

from __future__ import annotations

import pytest

from hetflow.infra.data.format import (
    read_manifest,
    synthetic_source,
    write_dataset,
)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_training_run_streams_its_share_and_reports_what_it_read(s3, tmp_path):
    """Two torchrun ranks train 2.5 epochs of a 20-shard dataset through one host cache that
    holds it: S3 bytes only in the first epoch (counted step by step), the cache's counts and
    the ranks' peak memory in the result, and the run's figures made from them."""
    from hetflow.config import ClusterSpec, DatasetSpec, TrainConfig
    from hetflow.records import Plan, RunResult
    from hetflow.training.launch.run import run_workers
    from hetflow.training.launch.spec import RunSpec
    from hetflow.training.metrics import summarize

    dataset = DatasetSpec(url="s3://hetflow-stream/run", cache_dir=str(tmp_path / "cache"))
    source = synthetic_source(1001, 0.2, 0)
    write_dataset(dataset.url, source, 40)  # 800 train samples in 20 shards, 201 test
    train = TrainConfig(
        recipe="digits-mlp", global_batch=80, steps=25, eval_every=10, schedule="equal"
    ).model_copy(update={"target_accuracy": None, "checkpoint_every": 100})
    spec = RunSpec(
        run_name="stream",
        variant="baseline",
        cluster=ClusterSpec.from_speeds([1.0, 1.0], emulate=False),
        dataset=dataset,
        train=train,
        plan=Plan.equal([30, 50]),
        run_dir=str(tmp_path / "run"),
    )
    result = RunResult.model_validate(run_workers(spec, timeout_s=200)[0])
    per_step = [sum(r.records[t].s3_bytes for r in result.ranks) for t in range(train.steps)]
    test_bytes = sum(s.bytes for s in read_manifest(dataset.url).splits["test"].shards)
    # An epoch is 10 steps; the first evaluation (after step 9) reads the test split, counted
    # with the step after it; from then on every read is a cache hit. (Where torchrun restarted
    # the group, the lost attempt's ranks read the first epoch into the host cache.)
    seen = f"S3 bytes per step {per_step}, restarts {result.lead.recovery.restarts}"
    assert sum(per_step[:10]) > 0 or result.lead.recovery.restarts > 0, seen
    assert per_step[10] == test_bytes and per_step[11:] == [0] * 14, seen
    assert all(sum(rec.s3_bytes for rec in r.records) <= r.cache.bytes_read for r in result.ranks)
    assert all(r.peak_rss_bytes > 0 and r.cache.hits > 0 for r in result.ranks)
    # each rank's fixed part, before it opened the data, is recorded apart from its peak
    assert all(0 < r.start_rss_bytes <= r.peak_rss_bytes for r in result.ranks)
    m = summarize(result, train.global_batch, None)
    assert m.s3_bytes_read == sum(r.cache.bytes_read for r in result.ranks) > 0
    assert 0 < m.cache_hit_ratio < 1 and m.final_accuracy > 0.5
