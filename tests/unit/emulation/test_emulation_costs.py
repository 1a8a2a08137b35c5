"""The emulated ranks of a job share the host's cost of each keyed compute phase
(`hetflow.emulation.costs.SharedCosts`): workers differ by their slowdown alone."""

from __future__ import annotations

import multiprocessing as mp

import pytest

from hetflow.config import ClusterSpec, DatasetSpec, TrainConfig
from hetflow.emulation.costs import SMOOTH_PHASES, SharedCosts
from hetflow.emulation.emulator import Emulator
from hetflow.emulation.link import Link
from hetflow.records import Plan
from hetflow.training.launch.spec import RunSpec, emulator_for


def _post(folder: str, rank: int, world: int, times: list[float], start) -> None:
    costs = SharedCosts(folder, rank, world, keep=len(times))
    start.wait()
    for t in times:
        costs.add(8, t)


def test_ranks_in_separate_processes_append_whole_records_and_read_every_ranks_least(tmp_path):
    # 4 processes post 300 phases each at once: no record is torn or lost, and the settled cost
    # is the least of every rank's recent phases, whichever process reads it
    world, n = 4, 300
    start = mp.get_context("spawn").Barrier(world)
    procs = [
        mp.get_context("spawn").Process(
            target=_post,
            args=(str(tmp_path), r, world, [1.0 + r + i / n for i in range(n)], start),
        )
        for r in range(world)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert (tmp_path / "0-8").stat().st_size == world * n * 12
    reader = SharedCosts(tmp_path, 3, world, keep=n)
    assert reader.settled(8) == 1.0  # rank 0's first phase, still among its last n


def test_two_workers_of_one_job_dilate_a_batch_in_the_ratio_of_their_slowdowns(tmp_path):
    # the slow worker's process ran the step with twice the host's noise: alone, it would read
    # twice slower again; sharing the cost, it is exactly 4x the fast one, its emulated ratio
    fast = Emulator(2.0, Link(None), costs=SharedCosts(tmp_path, 0, 2))
    slow = Emulator(8.0, Link(None), costs=SharedCosts(tmp_path, 1, 2))
    alone = Emulator(8.0, Link(None))
    assert fast.dilated(0.010, key=32) == pytest.approx(0.020)
    assert slow.dilated(0.020, key=32) == pytest.approx(0.080)
    assert alone.dilated(0.020, key=32) == pytest.approx(0.160)
    # another batch has a cost of its own
    assert slow.dilated(0.030, key=16) == pytest.approx(0.240)


def test_a_rank_s_old_phases_leave_the_cost_once_it_ran_the_key_keep_times_since(tmp_path):
    # a lasting rise of the host's cost shows after SMOOTH_PHASES phases, as in one process
    a, b = SharedCosts(tmp_path, 0, 2), SharedCosts(tmp_path, 1, 2)
    a.add(8, 1.0)
    took = [b.add(8, 3.0) for _ in range(SMOOTH_PHASES)]
    assert took[-1] == 1.0  # rank 0's phase is its latest
    took = [a.add(8, 3.0) for _ in range(SMOOTH_PHASES)]
    assert took[-1] == 3.0


def test_forget_starts_a_new_generation_of_costs(tmp_path):
    emu = Emulator(5.0, Link(None), costs=SharedCosts(tmp_path, 0, 1))
    assert emu.dilated(1.0, key=8) == 5.0
    emu.forget()  # a compression trial's timed steps: dilated from their own costs
    assert emu.dilated(3.0, key=8) == 15.0


def _spec(tmp_path, precisions: list[str]) -> RunSpec:
    cluster = ClusterSpec.from_speeds([1, 2], name="c")
    return RunSpec(
        run_name="r",
        variant="v",
        cluster=cluster,
        dataset=DatasetSpec(),
        train=TrainConfig(global_batch=8),
        plan=Plan(local_batches=[4, 4]),
        precisions=precisions,
        run_dir=str(tmp_path),
    )


def test_the_ranks_of_a_job_share_a_table_per_scope_and_precision(tmp_path):
    spec = _spec(tmp_path, ["fp32", "fp32"])
    a, b = emulator_for(spec, 0), emulator_for(spec, 1)
    assert a.costs.folder == b.costs.folder
    assert emulator_for(spec, 0, scope="profile").costs.folder != a.costs.folder
    mixed = _spec(tmp_path, ["fp32", "bf16"])  # bf16 steps cost the host something else
    assert emulator_for(mixed, 0).costs.folder != emulator_for(mixed, 1).costs.folder
    # a GPU's phase is its own wall time on the device: nothing shared
    assert emulator_for(spec, 0, sync=lambda: None).costs is None
