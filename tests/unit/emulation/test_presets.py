"""Emulated devices of their own: published per-batch curves, a worker's knee and fixed cost,
noise, and the link on the emulated clock."""

from __future__ import annotations

import pytest

from hetflow.config import ClusterSpec, ConfigError, WorkerSpec, parse_speeds, validated
from hetflow.emulation.device_model import published_shape
from hetflow.emulation.emulator import PAUSE_FACTOR, Emulator
from hetflow.emulation.link import Link
from hetflow.emulation.presets import PRESETS
from hetflow.perf.fitting import fit_affine


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_preset_reproduces_its_published_latencies_and_is_not_affine(name):
    p = PRESETS[name]
    best = min(ms / b for b, ms in p.latency_ms.items())
    for b, ms in p.latency_ms.items():  # at a published batch: the published latency
        assert p.shape(b) * b * best == pytest.approx(ms)
    assert min(p.shape(b) for b in range(1, 300)) == pytest.approx(1.0)
    # between published batches: between their per-sample times
    assert p.shape(4) >= p.shape(6) * 6 / 8 and p.shape(6) * 6 <= p.shape(8) * 8
    # what the planner fits (latency + per-sample x batch) misses the curve somewhere, as it
    # misses a real GPU's (the V100 by 7% at worst over batches 1-64, the T4 and A100 more)
    sizes = [1, 2, 4, 8, 16, 32, 64]
    a, c = fit_affine(sizes, [p.shape(b) * b for b in sizes])
    worst = max(abs((a + c * b) / (p.shape(b) * b) - 1) for b in sizes)
    assert worst > 0.05


def test_speeds_name_presets_and_the_preset_sets_the_speed():
    cluster = ClusterSpec.from_speeds(parse_speeds("t4, T4, v100, a100, 2"))
    assert [w.name for w in cluster.workers] == ["w0-t4", "w1-t4", "w2-v100", "w3-a100", "w4"]
    t4, _, v100, a100, plain = cluster.workers
    assert t4.speed < v100.speed < a100.speed  # published peaks: 1561, 3363, 6199 images/s
    assert a100.speed / t4.speed == pytest.approx(
        PRESETS["a100"].peak_samples_per_s / PRESETS["t4"].peak_samples_per_s, rel=1e-3
    )
    assert t4.shape(8) == PRESETS["t4"].shape(8) > 2
    # a worker of a speed alone keeps the host's curve (its speed holds at every batch), or
    # takes the published curve of a device of its speed where it asks
    assert plain.shape(8) == 1.0
    published = WorkerSpec(name="w5", speed=2.0, curve="published")
    assert published.shape(8) == published_shape(2.0, 8) > 1.0
    assert WorkerSpec(name="fast-t4", preset="t4", speed=9).speed == 9  # a given speed stays
    # as the job file carries it to the workers
    assert ClusterSpec.model_validate_json(cluster.model_dump_json()) == cluster


@pytest.mark.parametrize(
    ("worker", "expected"),
    [
        ({"name": "a", "preset": "h999"}, "workers.0.preset"),
        ({"name": "a", "preset": "t4", "knee_batch": 8}, "knee_batch: not with a preset"),
        ({"name": "a", "fixed_samples": -1}, "workers.0.fixed_samples"),
    ],
)
def test_a_bad_curve_is_refused_in_one_line_naming_the_field(worker, expected):
    with pytest.raises(ConfigError) as e:
        validated(ClusterSpec, {"workers": [worker]}, "cluster")
    assert expected in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="--speeds: worker 1: expected a number or a preset"):
        parse_speeds("1,h999")


def test_a_worker_with_a_knee_and_a_fixed_cost_dilates_by_its_own_curve():
    knee = WorkerSpec(name="k", knee_batch=16, fixed_samples=8)
    emu = Emulator(2.0, Link(None), jitter=0.0, shape=knee.shape)
    # batch 4 lasts as long as batch 16 (+ 8 samples' worth): 2 x 0.01 x (16 + 8) / 4
    assert emu.dilated(0.01, key=4) == pytest.approx(2 * 0.01 * 24 / 4)
    assert emu.dilated(0.05, key=64) == pytest.approx(2 * 0.05 * 72 / 64)
    assert emu.dilated(0.01) == pytest.approx(0.02)  # an unkeyed phase (a probe's) is not shaped


def test_noise_is_seeded_and_pauses_come_at_their_rate():
    def phases(seed):
        emu = Emulator(1.0, Link(None), jitter=0.05, seed=seed, pauses=0.1)
        return [emu.dilated(1.0, key=32) for _ in range(4000)]

    a, b = phases(7), phases(7)
    assert a == b and a != phases(8)  # drawn from the seed
    paused = [t for t in a if t > 2]
    assert 0.07 < len(paused) / len(a) < 0.13
    assert sum(paused) / len(paused) == pytest.approx(PAUSE_FACTOR, rel=0.05)
    calm = [t for t in a if t <= 2]
    assert 0.04 < (sum((t - 1) ** 2 for t in calm) / len(calm)) ** 0.5 < 0.06


def test_noise_is_on_by_default_and_switches_off():
    on = ClusterSpec.from_speeds([1, 2])
    off = ClusterSpec.from_speeds([1, 2], jitter=0, pauses=0)
    assert on.jitter > 0 and on.pauses > 0 and (off.jitter, off.pauses) == (0, 0)


def test_the_link_runs_on_the_emulated_clock():
    link = Link(1.0, 1e-3, scale=8.0)
    # 1 MB at 1 Gbit/s and 1 ms: 9 ms on the cluster, 8 x that on the emulated clock
    assert link.cost(1e6, 1) == pytest.approx(8 * (1e-3 + 8e-3))
    assert Link(1.0, 1e-3).cost(1e6, 1) == pytest.approx(9e-3)
