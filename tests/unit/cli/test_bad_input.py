"""Bad input gets one clear line naming the field, and nothing is launched."""

from __future__ import annotations

import pytest
import torch

from hetflow.cli import main
from hetflow.config import ConfigError, DatasetSpec, TrainConfig, load_mapping, validated

from tests.helpers.cli.bad_input import _hetflow

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


def test_a_parquet_column_the_files_lack_is_one_line(tmp_path):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "pq").mkdir()
    table = pa.table({"a": np.ones(8), "y": np.arange(8) % 2})
    pq.write_table(table, tmp_path / "pq" / "p.parquet")
    line = _hetflow(
        tmp_path,
        *("data", "ingest", "--source", "parquet", "--from", str(tmp_path / "pq")),
        *("--columns", "a,b", "--label-column", "y", "--to", f"file://{tmp_path}/out"),
    )
    assert "p.parquet: no column 'b'" in line
    assert not (tmp_path / "out").exists()


def test_a_dataset_the_local_store_lacks_is_one_line_before_any_flow(tmp_path):
    # nothing configured: the run's own S3 endpoint would load the store under HETFLOW_HOME,
    # so the check reads the store itself, as the user's s3:// URL
    line = _hetflow(tmp_path, "demo", "--dataset-url", "s3://my-bucket/corpus")
    assert "s3://my-bucket/corpus: no dataset here" in line and "file://" not in line, line
    assert "hetflow data ingest --to s3://my-bucket/corpus" in line


def test_a_recipe_that_does_not_fit_the_datas_shape_is_one_line_before_launch(tmp_path):
    """The default recipe (digits-cnn) on 5 features: refused by the command before any flow,
    and by the flows' own check (`ResolvedJob.check_data`, for data only a flow can read),
    naming `train.recipe` and the built-in recipes that fit."""
    import numpy as np

    from hetflow.config import ClusterSpec
    from hetflow.infra.data.format import read_manifest, write_dataset
    from hetflow.training.job import resolve_job

    rng = np.random.default_rng(0)
    url = (tmp_path / "tab").as_uri()
    split = (rng.random((40, 5), dtype=np.float32), rng.integers(0, 3, 40))
    write_dataset(url, {"train": split, "test": split}, shard_samples=16)
    line = _hetflow(tmp_path, "demo", "--dataset-url", url)
    expected = "train.recipe: digits-cnn needs a square number of features, not 5"
    assert expected in line and line.endswith("use --recipe digits-mlp or digits-wide-mlp"), line
    assert not (tmp_path / "home" / "runs").exists()
    with pytest.raises(ConfigError, match=expected) as e:
        resolve_job(ClusterSpec.from_speeds([1]), [TrainConfig()]).check_data(read_manifest(url))
    assert "\n" not in str(e.value)
    fits = resolve_job(ClusterSpec.from_speeds([1]), [TrainConfig(recipe="digits-mlp")])
    fits.check_data(read_manifest(url))


def test_an_image_folder_without_class_subfolders_is_one_line(tmp_path):
    from PIL import Image

    (tmp_path / "flat").mkdir()
    Image.new("RGB", (4, 4)).save(tmp_path / "flat" / "a.png")
    line = _hetflow(
        tmp_path,
        *("data", "ingest", "--source", "images", "--from", str(tmp_path / "flat")),
        *("--to", f"file://{tmp_path}/out"),
    )
    assert "flat: no images in class subfolders" in line


def test_the_console_filter_keeps_user_errors_off_the_terminal_and_bugs_on_it():
    import logging

    import hetflow.infra.data.format  # DatasetError: a type the filter knows once imported
    import hetflow.infra.pricing  # noqa: F401 (CatalogError, a ConfigError)
    from hetflow.cli.logs import HANDLER, ConsoleFilter, prefect_config

    def record(name, message, exc=None):
        info = (type(exc), exc, None) if exc else None
        return logging.LogRecord(name, logging.ERROR, __file__, 1, message, (), info)

    keep = ConsoleFilter().filter
    assert not keep(record("prefect.flow_runs", "Encountered exception", ConfigError("bad")))
    assert keep(record("prefect.flow_runs", "Encountered exception", ZeroDivisionError("bug")))
    state = "Finished in state Failed('Task run encountered an exception {}: x')"
    assert not keep(record("prefect.task_runs", state.format("DatasetError")))
    assert not keep(record("prefect.flow_runs", state.format("CatalogError")))  # a ConfigError
    assert keep(record("prefect.task_runs", state.format("KeyError")))
    retry = "Task run failed with exception: {}('x') - Retry 1/2 will start immediately"
    assert not keep(record("prefect.task_runs", retry.format("ChecksumError")))
    assert keep(record("prefect.task_runs", retry.format("OSError")))
    assert keep(record("prefect.flow_runs", "Beginning flow run"))
    config = prefect_config()  # Prefect's default, with the run's log and the filter added
    assert HANDLER in config["root"]["handlers"] and "console" in config["root"]["handlers"]
    assert config["handlers"]["console"]["filters"] == ["hetflow_console"]
    assert config["loggers"]["prefect"]["level"] == "${PREFECT_LOGGING_LEVEL}"


def test_a_validation_error_of_hetflow_s_own_records_is_a_bug_not_bad_input():
    """A run's figures that fail their own record's rules come from hetflow's code: the CLI
    shows the traceback (as for any bug), and the console filter lets it through."""
    import logging

    from pydantic import ValidationError

    from hetflow.cli import one_line
    from hetflow.cli.logs import ConsoleFilter
    from hetflow.figures import RankFigures

    with pytest.raises(ValidationError) as own:
        RankFigures(rank=0, local_batch=1.5, busy_fraction=0.5)
    with pytest.raises(ValidationError) as users:
        TrainConfig(global_batch=0)
    assert one_line(own.value) is None
    assert one_line(users.value).startswith("global_batch")
    record = logging.LogRecord("prefect.flow_runs", logging.ERROR, __file__, 1, "x", (), None)
    record.exc_info = (ValidationError, own.value, None)
    assert ConsoleFilter().filter(record)
    record.exc_info = (ValidationError, users.value, None)
    assert not ConsoleFilter().filter(record)
