"""Runs started at once on one host stay apart where they share something: the dataset they
ingest (one writes it, the others find it), Runs through
the Prefect API, each with its own run directory, checkpoints and MLflow run:
tests/integration/flows/test_stack_and_deploy.py
(`test_runs_triggered_through_the_prefect_api_...`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

INGEST = """
import sys
from hetflow.config import DatasetSpec
from hetflow.tasks.data import ingest_dataset
sys.stdin.readline()  # all start together
m = ingest_dataset.fn(DatasetSpec(url=sys.argv[1], shard_samples=256))
print("SAMPLES", m.splits["train"].samples)
"""


def _at_once(code: str, args: list[str], n: int) -> list[subprocess.CompletedProcess]:
    """`n` Python processes running `code`, released together once all have imported it."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, *args],
            env=dict(os.environ),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(n)
    ]
    outs = [p.communicate("go\n", timeout=150) for p in procs]
    return [
        subprocess.CompletedProcess(p.args, p.returncode, o, e) for p, (o, e) in zip(procs, outs)
    ]


def test_runs_ingesting_one_dataset_at_once_write_it_once(s3, hetflow_home, fault_table):
    from hetflow.infra.data.format import read_manifest

    url = "s3://hetflow-concurrent/digits"
    done = _at_once(INGEST, [url], 2)
    for p in done:
        assert p.returncode == 0, p.stderr[-3000:]
        assert "SAMPLES 1437" in p.stdout
    wrote = [p for p in done if "ingested digits" in p.stdout]
    found = [p for p in done if "dataset already at" in p.stdout]
    assert (len(wrote), len(found)) == (1, 1), [p.stdout for p in done]
    assert read_manifest(url).splits["train"].samples == 1437
    assert (hetflow_home / "locks").is_dir()
    fault_table.append(
        ("2 runs ingest one dataset at once", "ingest", "both finished, 1 write", 0, "none", 2)
    )
