"""Sharded data parallelism (`train.strategy: fsdp`): torchrun ranks with uneven local batches,
a rank the plan gives no samples included, train the weights of one process on the global
batch; each rank holds a shard of the state and writes it into the checkpoint's DCP folder,
which a run on fewer ranks reads back re-sharded; a checkpoint names its strategy and a run
under another refuses it."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetflow.cli import main
from hetflow.config import ClusterSpec, ConfigError, TrainConfig, check_job
from hetflow.training.loop.checkpoint_store import CheckpointStore
from hetflow.training.loop.state import Checkpoint
from hetflow.training.recipes import DataInfo, get_recipe


@pytest.mark.parametrize(
    "knobs, field",
    [
        ({"compression": "powersgd:4"}, "train.compression: 'powersgd:4' needs DDP's comm hook"),
        ({"compression": "auto"}, "train.compression: 'auto'"),
        ({"compression": "localsgd:4"}, "train.compression: 'localsgd:4'"),
        ({"allow_local_sgd": True}, "train.allow_local_sgd: local SGD averages whole replicas"),
        ({"precision": "fp16"}, "train.precision: fp16's loss scale checks each rank's shard"),
    ],
    ids=["powersgd", "auto", "localsgd", "allow-local-sgd", "fp16"],
)
def test_fsdp_refuses_what_needs_whole_replicas_or_a_comm_hook(knobs, field):
    cluster = ClusterSpec.from_speeds([1, 2])
    train = TrainConfig(strategy="fsdp", **knobs)
    with pytest.raises(ConfigError) as e:
        check_job(cluster, train)
    assert str(e.value).startswith(field) and "\n" not in str(e.value)
    check_job(cluster, train.model_copy(update={"strategy": "ddp", "precision": "fp32"}))


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--strategy", "zero3"], "--strategy: invalid choice: 'zero3'"),
        (["--strategy", "fsdp", "--allow-local-sgd"], "train.allow_local_sgd"),
        (["--strategy", "fsdp", "--precision", "fp16"], "train.precision"),
    ],
    ids=["unknown", "local-sgd", "fp16"],
)
def test_the_demo_refuses_fsdp_with_what_it_cannot_run_before_launch(argv, expected, capsys):
    assert main(["demo", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hetflow: error:") and expected in err and "\n" not in err


def test_the_optimized_variant_under_fsdp_plans_batches_and_compresses_nothing():
    optimized = TrainConfig.variant("optimized", strategy="fsdp")
    assert (optimized.schedule, optimized.compression) == ("dynamic", "none")
    assert TrainConfig.variant("optimized").compression == "auto"  # DDP's is unchanged


def test_a_checkpoint_names_its_strategy_and_an_old_one_was_ddps():
    ckpt = Checkpoint(
        step=4, workers=["w0"], model={}, optimizer={}, plan=[8], plans=[], evals=[],
        train_time_s=1.0, rebalancer={}, comm=None, trials=None, scaler={}, records=[[]],
        strategy="fsdp",
    )  # fmt: skip
    saved = ckpt.to_dict()
    assert Checkpoint.from_dict(saved, ["w0"]).strategy == "fsdp"
    del saved["strategy"]
    old = Checkpoint.from_dict(saved, ["w0"])
    old.check_strategy("ddp")
    with pytest.raises(ValueError, match="taken under 'ddp', this run is 'fsdp'"):
        old.check_strategy("fsdp")


def test_gpt_shards_its_blocks_and_keeps_the_tied_embedding_with_the_root():
    recipe = get_recipe("gpt", n_layer=2, n_head=2, n_embd=16, context=8)
    model = recipe.build_model(DataInfo(kind="tokens", vocab=256))
    assert recipe.shard_units(model) == list(model.blocks)
    mlp = get_recipe("digits-mlp")
    tabular = mlp.build_model(DataInfo())
    assert mlp.shard_units(tabular) == list(tabular.children())


def test_bench_fsdp_refuses_bad_flags_before_anything_runs(capsys):
    assert main(["bench", "fsdp", "--steps", "0"]) == 2
    assert "train.steps" in capsys.readouterr().err
    assert main(["bench", "fsdp", "--speeds", "1,0"]) == 2
    assert "--speeds" in capsys.readouterr().err


def test_bench_fsdp_ratios_are_fsdp_over_ddp_and_planned_over_equal():
    from hetflow.cli.commands import benchmark_module

    bench = benchmark_module("fsdp")

    def run(state: int, rss: int, tp: float) -> dict:
        return {
            "state_bytes": [state] * 4,
            "peak_rss_bytes": [rss] * 4,
            "throughput_samples_per_s": tp,
        }

    runs = {
        "ddp-equal": run(400, 1000, 100.0),
        "fsdp-equal": run(100, 900, 90.0),
        "ddp-proportional": run(400, 1000, 180.0),
        "fsdp-proportional": run(100, 900, 135.0),
    }
    r = bench.ratios(runs)
    assert r["state_bytes_fsdp_over_ddp"] == 100 / 400
    assert r["peak_rss_fsdp_over_ddp"] == 900 / 1000
    assert r["throughput_fsdp_over_ddp_equal"] == 90 / 100
    assert r["throughput_fsdp_over_ddp_planned"] == 135 / 180
    assert (r["planned_over_equal_ddp"], r["planned_over_equal_fsdp"]) == (1.8, 1.5)


def test_the_store_names_each_checkpoints_shards_and_removes_the_stale_folder(tmp_path):
    store = CheckpointStore(str(tmp_path / "ckpt"))
    for step in (2, 4, 6):
        name = store.shards_name(step)
        Path(store.at(name)).mkdir()
        (Path(store.at(name)) / "__0_0.distcp").write_bytes(b"shard")
        store.save(step, {"step": step, "shards": name}, name)
    assert store.load()["shards"] == "dcp-000006"
    folders = sorted(p.name for p in (tmp_path / "ckpt").glob("dcp-*"))
    assert folders == ["dcp-000004", "dcp-000006"]  # the checkpoint before the previous: gone
