"""`hetflow recommend --profiles`: a type profiled on its own hardware gets its measured
step-time curve and memory cap. The history is written by the real `profile_or_reuse` (its
torchrun profile replaced, as in test_history.py) to real S3 over moto's HTTP server, and read
back by the real command."""

from __future__ import annotations

import datetime as dt
import json

import pytest
import yaml

import hetflow.history.store as history_store
import hetflow.tasks.history as history_task
from hetflow.cli import main
from hetflow.config import ClusterSpec, DatasetSpec, TrainConfig, WorkerSpec
from hetflow.history import TypeEntry
from hetflow.infra.s3 import filesystem

from tests.helpers.infra.history import fake_measure

pytestmark = pytest.mark.timeout(240)


JOB = ["--recipe", "digits-mlp", "--global-batch", "2048", "--steps", "1000"]


@pytest.fixture
def history(s3, hetflow_home, prefect_harness, monkeypatch, request):
    """Two g5.xlarge and a g4dn.xlarge profiled unemulated on digits-mlp (each at 100 x its
    speed samples/s, caps 1000 and 1002): the history's URL."""
    dataset = DatasetSpec(url=f"s3://rechist-{request.node.name[5:40].replace('_', '-')}/d")
    monkeypatch.setattr(history_task, "measure_profile", fake_measure())
    workers = [
        WorkerSpec(name="a", instance_type="g5.xlarge", speed=2.0),
        WorkerSpec(name="b", instance_type="g5.xlarge", speed=2.0),
        WorkerSpec(name="c", instance_type="g4dn.xlarge", speed=1.0),
    ]
    cluster = ClusterSpec(name="real", workers=workers, emulate=False)
    history_task.profile_or_reuse.fn(cluster, dataset, TrainConfig(recipe="digits-mlp"))
    return history_store.types_prefix(dataset)


def test_recommend_reads_a_measured_curve_for_a_type_without_a_published_one(
    history, tmp_path, capsys
):
    out, fig = tmp_path / "c.yaml", tmp_path / "f.json"
    argv = ["recommend", "--candidates", "g5.xlarge:2,g4dn.xlarge:1", *JOB, "-o", str(out)]
    assert main([*argv, "--profiles", history, "--json", str(fig)]) == 0
    text = capsys.readouterr().out
    assert f"g5.xlarge -> measured, {history}/g5.xlarge-" in text
    assert "g4dn.xlarge -> measured" in text  # the history wins over the published T4 curve
    figures = json.loads(fig.read_text())
    assert figures["curves"]["g5.xlarge"].startswith(f"{history}/g5.xlarge-")
    # every local batch within the measured memory cap (1000; 1002 on the T4 entry)
    assert max(max(b) for b in figures["chosen"]["local_batches"] if b) <= 1002
    spec = ClusterSpec.model_validate(yaml.safe_load(out.read_text()))
    g5 = [w for w in spec.workers if w.instance_type == "g5.xlarge"]
    assert g5 and all(w.preset is None and w.speed == 1.0 for w in g5)  # A10G: no preset
    # the published curves alone: the A10G has none, and the line says how to give it one
    assert main([*argv]) == 2
    err = capsys.readouterr().err
    assert "g5.xlarge (A10G) has no step-time curve" in err and "--profiles" in err
    assert err.count("\n") == 1


def test_history_of_another_recipe_emulated_or_stale_is_not_a_curve(history, tmp_path, capsys):
    argv = ["recommend", "--candidates", "g5.xlarge:3", "-o", str(tmp_path / "c.yaml")]
    assert main([*argv, "--recipe", "digits-cnn", "--profiles", history]) == 2
    err = capsys.readouterr().err
    assert f"no profile history of it for digits-cnn under {history}" in err
    fs, root = filesystem(history)
    old = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=30)).strftime("%Y%m%dT%H%M%S%fZ")
    for path in fs.find(root):
        entry = TypeEntry.model_validate_json(fs.cat_file(path))
        fs.pipe_file(path, entry.model_copy(update={"measured_at": old}).model_dump_json().encode())
    assert main([*argv, *JOB, "--profiles", history]) == 2
    err = capsys.readouterr().err
    assert "is stale (its newest entry is 30.0 h old (> 24 h))" in err and err.count("\n") == 1
    assert main([*argv, *JOB, "--profiles", history, "--profile-max-age-h", "48"]) == 0
    assert "g5.xlarge -> measured" in capsys.readouterr().out


def test_the_flow_reads_the_same_history_as_the_command(history):
    from hetflow.config import (
        ProfileHistory,
        RecommendJob,
        RecommendMarket,
        RecommendObjective,
        RecommendRequest,
        RentableType,
    )
    from hetflow.tasks.recommend import recommend_mix

    job = RecommendJob(recipe="digits-mlp", global_batch=2048, steps=1000)
    cands = [RentableType(instance_type="g5.xlarge", count=3)]
    args = {"job": job, "candidates": cands, "objective": RecommendObjective()}
    args["market"] = RecommendMarket()
    out = recommend_mix.fn(RecommendRequest(**args, history=ProfileHistory(url=history)))
    assert out.rec.figures()["curves"]["g5.xlarge"].startswith(f"{history}/g5.xlarge-")
    assert f"step-time curve: g5.xlarge -> measured, {history}/" in out.rec.markdown()
    with pytest.raises(Exception, match="g5.xlarge \\(A10G\\) has no step-time curve"):
        recommend_mix.fn(RecommendRequest(**args))  # no history: the published curves only
