"""Probes: the memory count and the compute probe in process; a real profile of 4 emulated
workers. The line fits are tested in test_fitting.py."""

from __future__ import annotations

import io
import statistics
import time

import pytest
import torch

from hetflow.config import ClusterSpec
from hetflow.emulation.costs import SMOOTH_PHASES
from hetflow.emulation.emulator import Emulator
from hetflow.emulation.link import Link
from hetflow.flows.profile_cluster import print_profile_report, profile_report
from hetflow.training.probes.compute import probe_compute
from hetflow.training.probes.memory import saved_activation_bytes
from hetflow.training.recipes import DataInfo, get_recipe, seeded_model

from tests.profiles import profile_of, rank_profile


def test_saved_activation_bytes_grow_linearly_with_the_batch():
    model = seeded_model(get_recipe("digits-mlp"), DataInfo(), 0)
    x, y = torch.rand(64, 64), torch.randint(0, 10, (64,))
    m8, m32 = (
        saved_activation_bytes(model, x[:8], y[:8]),
        saved_activation_bytes(model, x[:32], y[:32]),
    )
    per_sample = (m32 - m8) / 24
    # input + two 256-wide hidden layers (pre/post ReLU) + logits, float32:
    # at least 4 x 64 + 4 x 512
    assert 4 * (64 + 512) <= per_sample <= 4 * (64 + 4 * 256 + 3 * 10)
    params = sum(p.numel() * 4 for p in model.parameters())
    assert m8 - 8 * per_sample < params / 4  # parameters are not counted as activations


def test_compute_probe_sees_the_dilation_of_two_emulators(monkeypatch):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a rank runs (threads_per_rank); more would fight for the cores
    monkeypatch.setattr("hetflow.training.probes.compute.COMPUTE_PAUSE_S", 0.03)
    model = seeded_model(get_recipe("digits-cnn"), DataInfo(), 0)
    x, y = torch.rand(64, 64), torch.randint(0, 10, (64,))
    fast = probe_compute(model, x, y, Emulator(3.0, Link(None)), [8, 16, 32], ref=16, budget_s=0.3)
    slow = probe_compute(model, x, y, Emulator(9.0, Link(None)), [8, 16, 32], ref=16, budget_s=0.3)
    torch.set_num_threads(threads)
    assert slow["samples_per_s"] / fast["samples_per_s"] == pytest.approx(1 / 3, rel=0.35)
    assert fast["compute_rounds"] >= 3 and fast["fit_s_per_sample"] > 0


def test_emulator_phase_ends_once_at_the_last_bucket():
    emu = Emulator(4.0, Link(None))
    hook = emu.dilating_hook(lambda state, bucket: ("reduced", bucket.last))

    class Bucket:
        def __init__(self, last: bool):
            self.last = last

        def is_last(self) -> bool:
            return self.last

    began = time.perf_counter()
    emu.start()
    cpu = time.thread_time()
    sum(i * i for i in range(200_000))  # some CPU work to dilate
    assert hook("state", Bucket(False)) == ("reduced", False)
    assert emu.finished_at == 0.0  # an earlier bucket does not end the phase
    assert hook("state", Bucket(True)) == ("reduced", True)
    spent = time.thread_time() - cpu
    end = emu.finished_at
    assert began < emu.computed_at <= end
    assert end - began >= 4.0 * spent * 0.9  # padded to slowdown x CPU time (sleep only overshoots)
    assert emu.finish() == end  # a second finish (the probe's, after backward) is a no-op


def test_profile_report_shape_and_table():
    cluster = ClusterSpec.from_speeds([1, 4])
    cluster.workers[0].link_gbps = 0.5
    ranks = [
        rank_profile(i, s, allreduce_latency_s=1e-3, link_gbps=g, memory_cap_batch=1000)
        for i, (s, g) in enumerate([(26.0, 0.48), (100.0, 9.0)])
    ]
    report = profile_report(profile_of(ranks, profiling_time_s=9.5), cluster)
    w0, w1 = report["workers"]
    assert set(w0) >= {
        "name",
        "emulated_speed",
        "measured_speed",
        "link_gbps_emulated",
        "link_gbps_measured",
        "link_latency_ms",
        "memory_cap_batch",
    }
    assert (w0["emulated_speed"], w0["measured_speed"], w1["measured_speed"]) == (0.25, 0.26, 1.0)
    assert (w0["link_gbps_emulated"], w1["link_gbps_emulated"], w0["link_latency_ms"]) == (
        0.5 / cluster.time_scale,  # on the emulated clock, as the compute
        None,
        1.0,
    )
    from rich.console import Console

    out = io.StringIO()
    print_profile_report(report, Console(file=out, width=200))
    text = out.getvalue()
    assert "+4.0%" in text and "loopback" in text and "9.5s" in text


def _burn(cpu_s: float) -> None:
    """Exactly `cpu_s` of this thread's CPU time."""
    t = time.thread_time()
    while time.thread_time() - t < cpu_s:
        pass


def _phase(emu: Emulator, cpu_s: float, key=None) -> float:
    began = time.perf_counter()
    emu.start(key)
    _burn(cpu_s)
    return emu.finish() - began


def test_a_keyed_phase_is_dilated_from_the_least_of_its_keys_recent_cpu_times():
    emu = Emulator(5.0, Link(None))
    for _ in range(3):
        assert emu.dilated(1.0, key=8) == 5.0
    # one phase of 5x the CPU time: the emulated device takes its usual time, where unkeyed
    # dilation makes it 5 x 5 long
    assert emu.dilated(5.0, key=8) == 5.0
    assert emu.dilated(5.0) == 25.0
    # another key has a history of its own
    assert emu.dilated(5.0, key=16) == 25.0
    # a lasting change shows once it fills the window (one of its phases ran above)
    took = [emu.dilated(5.0, key=8) for _ in range(SMOOTH_PHASES - 1)]
    assert took[-2] == 5.0 and took[-1] == 25.0
    # and a faster phase is the device's pace at once
    assert emu.dilated(1.0, key=8) == 5.0
    # forgotten (a compression trial's timed steps after its cheaper warm-up): a phase's own
    emu.forget()
    assert emu.dilated(3.0, key=8) == 15.0


def test_finish_pads_a_keyed_phase_and_records_its_cpu_time_under_the_key():
    unit = 0.004
    emu = Emulator(5.0, Link(None))
    assert _phase(emu, unit, key=8) >= 5 * unit  # padded (sleep only overshoots)
    # the phase's CPU time (a little over `unit`) is key 8's least so far; nothing went to key 16
    assert 5 * unit <= emu.dilated(100.0, key=8) < 5 * 2 * unit
    assert emu.dilated(100.0, key=16) == 500.0


@pytest.mark.parametrize("jitter", [0.0, 0.3])
def test_jitter_varies_each_keyed_phase_by_the_coefficient_asked_for(jitter):
    emu, again = (
        Emulator(8.0, Link(None), jitter=jitter, seed=3),
        Emulator(8.0, Link(None), jitter=jitter, seed=3),
    )
    took = [emu.dilated(0.002, key=4) for _ in range(40)]
    cv = statistics.stdev(took) / statistics.mean(took)
    if jitter:
        assert 0.15 < cv < 0.5
        assert statistics.mean(took) == pytest.approx(8 * 0.002, rel=0.25)  # the mean pace is kept
        # the draws come from the seed: a second emulator of the same seed repeats them
        assert [again.dilated(0.002, key=4) for _ in range(5)] == took[:5]
    else:
        assert cv == 0.0


def test_a_phase_of_no_samples_is_not_padded_to_the_emulated_device(monkeypatch):
    # a rank the plan leaves out (batch 0) does no device work: no sleep after its empty step
    slept: list[float] = []
    monkeypatch.setattr("hetflow.emulation.emulator.time.sleep", slept.append)
    emu = Emulator(50.0, Link(None))
    _phase(emu, 0.002, key=0)
    assert slept == []
    _phase(emu, 0.002, key=8)  # the same CPU time with samples is padded to 50x
    assert len(slept) == 1 and slept[0] > 0.05


def test_under_fsdp_the_compute_probe_times_the_sharded_step(tmp_path, monkeypatch):
    """The probe steps the model as fsdp trains it (FSDP2 units, then the root), on a mesh of
    this rank alone, so FSDP's own work of a step is in the figure the plan prices."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    from hetflow.training.probes.compute import solo_sharded

    monkeypatch.setattr("hetflow.training.probes.compute.COMPUTE_PAUSE_S", 0.0)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        recipe = get_recipe("gpt", n_layer=2, n_embd=32, n_head=2, context=16)
        model = seeded_model(recipe, DataInfo(), 0)
        net = solo_sharded(model, recipe.shard_units(model))
        blocks = recipe.shard_units(model)
        assert isinstance(net, FSDPModule) and all(isinstance(b, FSDPModule) for b in blocks)
        assert all(isinstance(p, DTensor) for p in net.parameters())
        x = torch.randint(0, 256, (16, 17)).numpy()
        got = probe_compute(net, x, x, Emulator(2.0, Link(None)), [2, 4, 8], 4, 0.2, recipe)
        assert got["fit_s_per_sample"] > 0 and got["compute_rounds"] >= SMOOTH_PHASES
        assert all(p.grad is None for p in net.parameters())  # each step zeroes its gradient
    finally:
        dist.destroy_process_group()
