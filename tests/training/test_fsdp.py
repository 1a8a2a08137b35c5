"""Sharded data parallelism (`train.strategy: fsdp`): torchrun ranks with uneven local batches,
a rank the plan gives no samples included, train the weights of one process on the global
batch; each rank holds a shard of the state and writes it into the checkpoint's DCP folder,
which a run on fewer ranks reads back re-sharded; a checkpoint names its strategy and a run
under another refuses it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from hetflow.cli import main
from hetflow.config import ClusterSpec, ConfigError, TrainConfig, check_job
from hetflow.infra.s3 import ensure_bucket, filesystem
from hetflow.records import Plan
from hetflow.training.launch.run import run_workers
from hetflow.training.launch.spec import RunSpec
from hetflow.training.loop import sharded
from hetflow.training.loop.checkpoint_store import CheckpointStore
from hetflow.training.loop.state import Checkpoint
from hetflow.training.recipes import DataInfo, get_recipe, seeded_model

from tests.training.test_training import (
    _assert_same_params,
    _single_process_steps,
    assert_moved_off_the_straggler,
    no_restarts,
    straggler_run,
)

STEPS = 3


def fsdp_spec(dataset, run_dir: Path, plan: list[int], strategy: str = "fsdp") -> RunSpec:
    train = TrainConfig(
        recipe="digits-mlp",
        global_batch=sum(plan),
        steps=STEPS,
        optimizer="sgd",
        lr=0.3,
        momentum=0.9,
        schedule="proportional",
        target_accuracy=None,
        eval_every=2,
        checkpoint_every=2,
        strategy=strategy,
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    return RunSpec(
        run_name=run_dir.name,
        variant=run_dir.name,
        cluster=ClusterSpec.from_speeds([1.0] * len(plan), emulate=False),
        dataset=dataset,
        train=train,
        plan=Plan.equal(plan),
        run_dir=str(run_dir),
    )


def dcp_state(folder: Path, tmp_path: Path) -> dict:
    """A DCP folder's state, whole, as `sharded.save_shards` wrote it ({"model", "optim"})."""
    dcp_to_torch_save(folder, tmp_path / "whole.pt")
    return torch.load(tmp_path / "whole.pt", weights_only=False)


def assert_same_momentum(saved: dict, model: dict, opt: dict) -> None:
    """`saved` (optimizer state keyed by name) holds the momentum of `opt` (keyed by index)."""
    for i, name in enumerate(model):
        torch.testing.assert_close(
            saved["state"][name]["momentum_buffer"],
            opt["state"][i]["momentum_buffer"],
            atol=1e-5,
            rtol=0,
        )


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("plan", [[3, 9, 20], [13, 0, 19]], ids=["uneven", "one-empty"])
def test_fsdp_on_uneven_batches_trains_the_weights_of_one_process(digits, tmp_path, plan):
    spec = fsdp_spec(digits, tmp_path / "fsdp", plan)
    result, _ = run_workers(no_restarts(spec), timeout_s=240)
    reference = _single_process_steps(spec, [{"step": 0, "plan": plan}], STEPS)
    _assert_same_params(torch.load(Path(spec.run_dir) / "model.pt"), reference[-1][0])
    # the checkpoint after step 2 names its DCP folder, one file per rank, which holds the
    # model and momentum of one process
    saved = CheckpointStore(f"{spec.run_dir}/checkpoints").load()
    assert saved["step"] == 2 and saved["strategy"] == "fsdp" and saved["model"] == {}
    folder = Path(spec.run_dir) / "checkpoints" / saved["shards"]
    assert len(list(folder.glob("*.distcp"))) == len(plan)
    whole = dcp_state(folder, tmp_path)
    model, opt = reference[1]
    _assert_same_params(whole["model"], model)
    assert_same_momentum(whole["optim"], model, opt)
    # every rank holds a shard: together the whole state, each about a third of it
    ranks = result["ranks"]
    initial = seeded_model(get_recipe(spec.train.recipe), DataInfo(), spec.train.seed)
    whole = sum(sharded.local_bytes(p) for p in initial.parameters())
    held = [r["state_bytes"] for r in ranks]
    assert sum(held) == 3 * whole  # parameters, gradients, SGD's momentum
    assert max(held) < 0.5 * 3 * whole, held
    assert all(r["peak_device_bytes"] > 0 for r in ranks)
    assert [rec["batch"] for rec in ranks[1]["records"]] == [plan[1]] * STEPS
    # the shards' all-gathers and reduce-scatters are counted, the same whatever the batch
    sent = [[rec["bytes_sent"] for rec in r["records"]] for r in ranks]
    assert sent[0][0] > 0 and all(s == sent[0] for s in sent), sent


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_sharded_run_resumes_its_checkpoint_on_fewer_workers(digits, tmp_path):
    # three workers checkpoint after step 2 (each its shards, through DCP); two of them go on
    # from it, re-sharded, with the same global batch: the weights and momentum are still
    # one process's on the whole batch (step t reads the same samples whatever the plan)
    three = fsdp_spec(digits, tmp_path / "three", [5, 9, 18])
    run_workers(no_restarts(three), timeout_s=240)
    two = fsdp_spec(digits, tmp_path / "two", [12, 20])
    two = two.model_copy(
        update={
            "checkpoint_url": f"{three.run_dir}/checkpoints",
            "train": two.train.model_copy(update={"steps": 5}),
        }
    )
    result, _ = run_workers(no_restarts(two), timeout_s=240)
    assert [rec["step"] for rec in result["ranks"][0]["records"]][-3:] == [2, 3, 4]
    assert result["ranks"][0]["plans"][-1] == {"step": 2, "plan": [12, 20]}
    reference = _single_process_steps(three, [{"step": 0, "plan": [5, 9, 18]}], 5)
    _assert_same_params(torch.load(Path(two.run_dir) / "model.pt"), reference[-1][0])
    # the two ranks' checkpoint after step 4, in the same store: their shards, the step-2
    # folder still there as the previous checkpoint
    saved = CheckpointStore(f"{three.run_dir}/checkpoints").load()
    folder = Path(three.run_dir) / "checkpoints" / saved["shards"]
    assert saved["step"] == 4 and len(list(folder.glob("*.distcp"))) == 2
    assert (folder.parent / "dcp-000002").is_dir()
    whole = dcp_state(folder, tmp_path)
    _assert_same_params(whole["model"], reference[3][0])
    assert_same_momentum(whole["optim"], *reference[3])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sharded_checkpoints_in_s3_resume_on_fewer_workers(digits, tmp_path):
    # the run's checkpoint URL in S3 (the moto endpoint): each rank's shards go there through
    # fsspec, and a run on fewer ranks goes on from them
    url = "s3://hetflow-fsdp/run/checkpoints"
    ensure_bucket(url)
    three = fsdp_spec(digits, tmp_path / "three", [5, 9, 18]).model_copy(
        update={"checkpoint_url": url}
    )
    run_workers(no_restarts(three), timeout_s=240)
    saved = CheckpointStore(url).load()
    fs, root = filesystem(f"{url}/{saved['shards']}")
    assert len([f for f in fs.ls(root) if f.endswith(".distcp")]) == 3
    two = fsdp_spec(digits, tmp_path / "two", [12, 20])
    two = two.model_copy(
        update={"checkpoint_url": url, "train": two.train.model_copy(update={"steps": 5})}
    )
    result, _ = run_workers(no_restarts(two), timeout_s=240)
    assert result["ranks"][0]["plans"][-1] == {"step": 2, "plan": [12, 20]}  # resumed at 2
    reference = _single_process_steps(three, [{"step": 0, "plan": [5, 9, 18]}], 5)
    _assert_same_params(torch.load(Path(two.run_dir) / "model.pt"), reference[-1][0])


@pytest.mark.parametrize("where", ["local", "s3"])
def test_shards_go_to_a_local_folder_or_s3_and_come_back(s3, tmp_path, where):
    # one process (DCP without a process group): the fsspec path to the moto endpoint too
    url = str(tmp_path / "dcp-000001") if where == "local" else "s3://hetflow-dcp/run/dcp-000001"
    ensure_bucket(url)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    sharded.save_shards(model, opt, url)
    other = torch.nn.Linear(4, 3)
    other_opt = torch.optim.SGD(other.parameters(), lr=0.1, momentum=0.9)
    sharded.load_shards(other, other_opt, url)
    _assert_same_params(other.state_dict(), model.state_dict())
    assert_same_momentum(
        sharded.full_state(other, other_opt)[1], model.state_dict(), opt.state_dict()
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_run_refuses_a_checkpoint_taken_under_another_strategy(digits, tmp_path):
    ddp = fsdp_spec(digits, tmp_path / "ddp", [8, 8], strategy="ddp")
    result, _ = run_workers(no_restarts(ddp), timeout_s=200)
    assert result["ranks"][0]["state_bytes"] == result["ranks"][1]["state_bytes"]
    resumed = fsdp_spec(digits, tmp_path / "fsdp", [8, 8]).model_copy(
        update={"checkpoint_url": f"{ddp.run_dir}/checkpoints"}
    )
    with pytest.raises(Exception, match="train.strategy: the checkpoint of step 2 was taken "):
        run_workers(no_restarts(resumed), timeout_s=200)


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


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_under_fsdp_the_dynamic_plan_moves_work_off_a_straggler(digits, tmp_path):
    # as tests/training/test_training.py's DDP test: rank 3 slows 8x at step 12 (4x, under FSDP's
    # fixed per-step cost, left an imbalance of 0.27-0.31, at the threshold), and the step-by-step
    # shared timings re-plan a few steps later, every rank alike, the global batch kept. The
    # others wait for it after the optimizer's step (`sharded.end_phase_at_step`), not in the
    # next forward's all-gather: otherwise every rank's compute time rises with the straggler's
    # and the re-balancer sees no imbalance (with a 4x straggler it did not re-plan at all)
    assert_moved_off_the_straggler(straggler_run(digits, tmp_path, 8.0, strategy="fsdp"))


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
