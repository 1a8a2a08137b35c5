"""Sharded data parallelism (`train.strategy: fsdp`): torchrun ranks with uneven local batches,
a rank the plan gives no samples included, train the weights of one process on the global
batch; each rank holds a shard of the state and writes it into the checkpoint's DCP folder,
which a run on fewer ranks reads back re-sharded; a checkpoint names its strategy and a run
under another refuses it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hetflow.infra.s3 import ensure_bucket, filesystem
from hetflow.training.launch.run import run_workers
from hetflow.training.loop import sharded
from hetflow.training.loop.checkpoint_store import CheckpointStore
from hetflow.training.recipes import DataInfo, get_recipe, seeded_model

from tests.helpers.training.fsdp import STEPS, assert_same_momentum, dcp_state, fsdp_spec
from tests.integration.training.test_training import (
    _assert_same_params,
    _single_process_steps,
    assert_moved_off_the_straggler,
    no_restarts,
    straggler_run,
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


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_under_fsdp_the_dynamic_plan_moves_work_off_a_straggler(digits, tmp_path):
    # as tests/integration/training/test_training.py's DDP test: rank 3 slows 16x at step 12
    # (4x, under FSDP's fixed per-step cost, left an imbalance of 0.27-0.31, at the threshold;
    # the DDP test says why not 8x), and the step-by-step
    # shared timings re-plan a few steps later, every rank alike, the global batch kept. The
    # others wait for it after the optimizer's step (`sharded.end_phase_at_step`), not in the
    # next forward's all-gather: otherwise every rank's compute time rises with the straggler's
    # and the re-balancer sees no imbalance (with a 4x straggler it did not re-plan at all)
    assert_moved_off_the_straggler(straggler_run(digits, tmp_path, 16.0, strategy="fsdp"))
