"""docs/data.md's "Your own data" as a user runs it, each command a process of its own, with
nothing configured but HETFLOW_HOME: `hetflow data ingest` of a text folder to s3://, then
`hetflow demo --recipe gpt --dataset-url` on it, then `hetflow data ls` listing it.
The demo is kept small (one worker, one step, a tiny gpt); the sequence is the README's."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.procs import run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

URL = "s3://my-bucket/corpus"
TINY_GPT = ["n_layer=1", "n_head=1", "n_embd=8", "context=8"]


def _env(home) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "MLFLOW_", "PREFECT_API", "HTTP_PROXY", "HTTPS_PROXY"))
    }
    env.update(
        HETFLOW_HOME=str(home),
        PREFECT_HOME=str(home / "prefect"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_LOGGING_LEVEL="INFO",  # as a user sees it: the flow's "S3: ..." line
        # Prefect's temporary server gets 20 s to answer by default; a loaded 2-core host needs more
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="120",
    )
    return env


def _ok(proc, both: bool = False) -> str:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr if both else proc.stdout


def test_ingest_then_demo_then_ls_with_nothing_configured(tmp_path):
    home, corpus = tmp_path / "home", tmp_path / "corpus"
    (corpus / "notes").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(3):
        text = bytes(rng.integers(32, 127, size=20_000, dtype=np.uint8))
        (corpus / "notes" / f"doc{i}.txt").write_bytes(text)
    env = _env(home)
    ingest = [
        "data", "ingest", "--source", "text", "--from", str(corpus), "--glob", "**/*.txt",
        "--to", URL,
    ]  # fmt: skip
    splits = json.loads(_ok(run_cli(ingest, env, timeout=240)).strip().splitlines()[-1])
    assert splits["train"] + splits["test"] == 60_000  # the corpus's bytes, as tokens
    assert (home / "s3/my-bucket/corpus/manifest.json").is_file()

    out = tmp_path / "demo.json"
    demo = ["demo", "--recipe", "gpt", "--dataset-url", URL, "--speeds", "1", "--steps", "1"]
    demo += ["--global-batch", "4", "--json", str(out)]
    for option in TINY_GPT:
        demo += ["--recipe-option", option]
    said = _ok(run_cli(demo, env, timeout=500), both=True)
    assert f"objects kept in {home / 's3'}" in said  # the store's endpoint, not an empty one
    table = json.loads(out.read_text())
    assert set(table) == {"baseline", "optimized", "order", "startup"}  # which ran first, phases
    assert sorted(table["order"]) == ["baseline", "optimized"]
    assert table["baseline"]["final_val_loss"] > 0  # it trained on the ingested tokens

    listed = _ok(run_cli(["data", "ls"], env, timeout=60)).strip().splitlines()
    assert listed[0].startswith("# 1 dataset in the local S3 store")
    assert listed[1].startswith(f"{URL}  tokens") and "train " in listed[1]
    assert f"train {splits['train']}, test {splits['test']}" in listed[1]
