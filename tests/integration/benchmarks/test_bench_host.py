"""`hetflow bench host`, small: real gloo processes and real steps, JSON shape and what holds."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_bench_host_times_the_all_reduce_of_each_world_and_the_step_at_each_batch(tmp_path):
    path = tmp_path / "host.json"
    argv = ["--worlds", "2,3", "--batches", "16,8,32", "--passes", "2", "--json", str(path)]
    # as a user runs it, in a process of its own: the benchmark forks its gloo ranks, which a
    # test runner's worker (threads of its own) cannot do safely
    cmd = [sys.executable, "-m", "hetflow.cli", "bench", "host", *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = json.loads(path.read_text())
    assert [r["world"] for r in out["allreduce"]] == [2, 3]
    for r in out["allreduce"]:
        assert r["bytes"] == out["allreduce"][0]["bytes"] > 100_000  # digits-cnn's gradient
        assert 0 < r["median_ms"] <= r["p90_ms"] and r["cpu_ms_per_process"] > 0
        assert r["tcp_ring_chain_ms"] > 0  # the same messages over plain sockets
        assert r["gloo_threads"] == 2  # torch's default unless --gloo-threads says otherwise
    c = out["compute"]
    assert c["batches"] == [8, 16, 32]  # sorted
    assert len(c["passes"]) == 2 and len(c["last_over_first"]) == 3
    for p in c["passes"]:
        assert all(t > 0 for t in p["least_ms"])
        assert p["least_ms"][2] > p["least_ms"][0]  # 4x the samples cost more
        assert len(p["off_line"]) == 3
