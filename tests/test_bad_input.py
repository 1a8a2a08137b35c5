"""Bad input gets one clear line naming the field, and nothing is launched."""

from __future__ import annotations

import pytest
import torch

from hetflow.cli import main
from hetflow.config import ConfigError, DatasetSpec, TrainConfig, load_mapping, validated

CASES = {
    "negative speed": (["--speeds", "1,-1,2"], "--speeds: worker 1 speed"),
    "zero speed": (["--speeds", "0,1"], "--speeds: worker 0 speed"),
    "non-finite speed": (["--speeds", "1,nan"], "--speeds: worker 1 speed"),
    "not a number": (["--speeds", "1,fast"], "--speeds"),
    "batch below world size": (
        ["--speeds", "1,1,2,4", "--global-batch", "3"],
        "train.global_batch",
    ),
    "unknown recipe": (["--recipe", "resnet9000"], "--recipe"),
    "recipe that does not import": (["--recipe", "no_such_pkg.mod:Recipe"], "train.recipe"),
    "--model, replaced by --recipe": (["--model", "cnn"], "--recipe"),
    "unknown recipe option": (["--recipe", "gpt", "--recipe-option", "layers=2"], "recipe_options"),
    "dataset url without scheme": (["--dataset-url", "bucket/digits"], "url"),
}


if not torch.cuda.is_available():
    CASES["cuda on a machine without it"] = (["--device", "cuda"], "cluster.workers[w0].device")


@pytest.mark.parametrize("argv, expected", CASES.values(), ids=CASES.keys())
def test_demo_refuses_bad_input_before_launch(argv, expected, capsys, hetflow_home):
    assert main(["demo", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hetflow: error:") and expected in err
    assert len(err.splitlines()) == 1
    assert not (hetflow_home / "runs").exists()  # nothing was launched


@pytest.mark.parametrize(
    "text, suffix, expected",
    [
        ("workers: [ {name: a, speed: 1}\n", ".yaml", "not valid YAML/JSON"),
        ("{not json", ".json", "not valid YAML/JSON"),
        ("- just\n- a list\n", ".yaml", "expected a mapping"),
        ("workers:\n  - {name: a, speed: 1}\n  - {name: a, speed: 2}\n", ".yaml", "appears twice"),
        ("workers:\n  - {name: a, speed: -3}\n", ".yaml", "workers.0.speed"),
        ("workers:\n  - {name: a, spede: 3}\n", ".yaml", "workers.0.spede"),
        ("workers:\n  - {name: a, speed: 1}\njitter: 1.5\n", ".yaml", "jitter"),
    ],
    ids=[
        "bad-yaml",
        "bad-json",
        "not-a-mapping",
        "duplicate-worker",
        "negative-speed",
        "unknown-field",
        "jitter-above-1",
    ],
)
def test_bad_cluster_file_is_refused_with_one_line(
    tmp_path, capsys, text, suffix, expected, hetflow_home
):
    path = tmp_path / f"cluster{suffix}"
    path.write_text(text)
    assert main(["demo", "--cluster", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and len(err.splitlines()) == 1
    assert not (hetflow_home / "runs").exists()


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("compression", "gzip", "compression"),
        ("compression", "powersgd:0", "powersgd rank"),
        ("compression", "topk:1.5", "topk ratio"),
        ("compression", "topk:0", "topk ratio"),
        ("compression", "localsgd:0", "localsgd period"),
        ("target_accuracy", 0.0, "target_accuracy"),
        ("target_accuracy", 1.2, "target_accuracy"),
    ],
)
def test_train_config_names_the_bad_field(field, value, expected):
    with pytest.raises(ConfigError) as e:
        validated(TrainConfig, {field: value}, "train")
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_cluster_file_that_is_fine_loads(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "name: mix\nworkers:\n  - {name: a, speed: 1}\n  - {name: b, speed: 3, link_gbps: 1}\n"
    )
    assert load_mapping(path)["name"] == "mix"
    assert DatasetSpec(url="s3://b/p/").url == "s3://b/p"


def test_the_launcher_left_empty_is_hetflow_launchers_and_a_bad_one_is_named(monkeypatch):
    from hetflow.config import ClusterSpec

    workers = {"workers": [{"name": "a"}]}
    monkeypatch.delenv("HETFLOW_LAUNCHER", raising=False)
    assert validated(ClusterSpec, workers, "cluster").launcher == "local"
    monkeypatch.setenv("HETFLOW_LAUNCHER", "ray")
    assert validated(ClusterSpec, workers, "cluster").launcher == "ray"
    assert validated(ClusterSpec, {**workers, "launcher": "local"}, "cluster").launcher == "local"
    monkeypatch.setenv("HETFLOW_LAUNCHER", "slurm")
    with pytest.raises(ConfigError) as e:
        validated(ClusterSpec, workers, "cluster")
    assert "cluster.launcher" in str(e.value) and "\n" not in str(e.value)
