"""The emulated device model (`hetflow.emulation.device_model`): each device's own curve,
noise at measured levels with slow stretches, stragglers that drift or jump, a memory cliff;
and how the cluster file, the job file and `hetflow bench hetero` name them."""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from hetflow.config import ClusterSpec, ConfigError, WorkerSpec, validated
from hetflow.emulation.device_model import (
    NOISE_LEVELS,
    PAUSE_FACTOR,
    Device,
    EmulatedCluster,
    StepNoise,
    published_shape,
    straggler_factor,
)
from hetflow.emulation.emulator import Emulator
from hetflow.emulation.link import Link
from hetflow.emulation.presets import PRESETS
from hetflow.perf.fitting import fit_affine
from hetflow.records import Plan
from hetflow.training.plan.ranks import RankMap

STEPS = 20_000


def _calm(level: str):
    """The level without its pauses: the log-normal part alone."""
    return dataclasses.replace(NOISE_LEVELS[level], pauses=0.0)


def _series(noise, seed: int, steps: int = STEPS) -> list[float]:
    drawn = StepNoise(noise, seed)
    return [drawn.factor(s) for s in range(steps)]


def _autocorrelation(xs: list[float], lag: int) -> float:
    mean = statistics.fmean(xs)
    var = sum((x - mean) ** 2 for x in xs)
    return sum((a - mean) * (b - mean) for a, b in zip(xs[:-lag], xs[lag:], strict=True)) / var


@pytest.mark.parametrize("level", ["alone", "shared"])
def test_each_noise_level_keeps_the_mean_pace_at_its_coefficient_of_variation(level):
    noise = _calm(level)
    factors = _series(noise, 4)
    assert statistics.fmean(factors) == pytest.approx(1.0, abs=0.02)
    cv = statistics.stdev(factors) / statistics.fmean(factors)
    assert cv == pytest.approx(noise.cv, rel=0.15)


def test_shared_noise_comes_in_slow_stretches_and_alone_noise_does_not():
    def logs(level):
        return [math.log(f) for f in _series(_calm(level), 11)]

    shared, alone = logs("shared"), logs("alone")
    expected = NOISE_LEVELS["shared"].autocorrelation(1)
    assert expected > 0.2
    assert _autocorrelation(shared, 1) == pytest.approx(expected, abs=0.05)
    # a stretch ends: correlation fades over the level's correlation time
    assert _autocorrelation(shared, 20) < _autocorrelation(shared, 1) / 3
    assert abs(_autocorrelation(alone, 1)) < 0.05


def test_pauses_come_at_the_levels_rate_and_last_pause_factor_times_a_step():
    noise = NOISE_LEVELS["shared"]
    pauses_alone = _series(dataclasses.replace(noise, cv=0.0), 2)
    assert set(pauses_alone) == {1.0, PAUSE_FACTOR}
    assert pauses_alone.count(PAUSE_FACTOR) / STEPS == pytest.approx(noise.pauses, rel=0.2)
    # with the log-normal part: its mean is 1, so the pauses alone lengthen the mean step
    mean = statistics.fmean(_series(noise, 2))
    assert mean == pytest.approx(1 + noise.pauses * (PAUSE_FACTOR - 1), abs=0.02)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    steps=st.lists(st.integers(0, 300), min_size=1, max_size=8),
    level=st.sampled_from(sorted(NOISE_LEVELS)),
)
def test_a_steps_noise_depends_on_the_seed_and_the_step_not_on_what_was_asked_before(
    seed, steps, level
):
    ordered = StepNoise(NOISE_LEVELS[level], seed)
    expected = {s: ordered.factor(s) for s in sorted(steps)}
    shuffled = StepNoise(NOISE_LEVELS[level], seed)
    assert {s: shuffled.factor(s) for s in reversed(steps)} == expected


@settings(max_examples=60, deadline=None)
@given(
    at=st.integers(0, 100),
    factor=st.floats(0.2, 8.0).filter(lambda f: abs(f - 1) > 1e-3),
    ramp=st.integers(0, 40),
)
def test_a_straggler_drifts_in_monotonically_and_reaches_its_factor_at_onset_plus_ramp(
    at, factor, ramp
):
    entry = [(2, at, factor, ramp)]
    path = [straggler_factor(entry, 2, s) for s in range(at + ramp + 10)]
    assert path[:at] == [1.0] * at
    assert path[at + ramp] == pytest.approx(factor)
    assert path[at + ramp :] == pytest.approx([factor] * 10)
    moves = [b - a for a, b in itertools.pairwise(path)]
    assert all(m >= -1e-12 for m in moves) if factor > 1 else all(m <= 1e-12 for m in moves)
    if ramp > 1:  # gradual: part of the way in the middle of its ramp
        mid = path[at + ramp // 2]
        assert min(1.0, factor) < mid < max(1.0, factor)
    assert straggler_factor(entry, 1, at + ramp) == 1.0  # other ranks untouched


def test_a_ramp_of_zero_is_the_jump_a_three_field_straggler_makes():
    for step in range(20):
        assert straggler_factor([(0, 5, 3.0, 0)], 0, step) == straggler_factor(
            [(0, 5, 3.0)], 0, step
        )


def test_a_later_straggler_drifts_from_the_factor_in_force_to_its_own():
    entries = [(0, 0, 2.0), (0, 10, 8.0, 4)]
    assert straggler_factor(entries, 0, 10) == pytest.approx(2.0)
    assert straggler_factor(entries, 0, 12) == pytest.approx(4.0)  # geometric halfway
    assert straggler_factor(entries, 0, 14) == pytest.approx(8.0)


@pytest.mark.parametrize("cliff_batch", [8, 32, 100])
def test_a_memory_cliff_slows_only_the_steps_past_its_batch(cliff_batch):
    plain = Device(speed=2.0)
    cliffed = Device(speed=2.0, cliff_batch=cliff_batch, cliff_factor=4.0)
    for batch in range(1, 160):
        ratio = cliffed.compute_s(batch) / plain.compute_s(batch)
        assert ratio == pytest.approx(4.0 if batch > cliff_batch else 1.0)


def test_devices_of_other_speeds_have_curves_of_other_shapes_that_no_line_fits():
    batches = [1, 2, 4, 8, 16, 32, 64]
    shapes = {s: [published_shape(s, b) for b in batches] for s in (1.0, 2.0, 4.0, 8.0)}
    assert len({tuple(v) for v in shapes.values()}) == len(shapes)  # each its own
    for speed in shapes:
        device = Device(speed=speed, curve="published")
        times = [device.compute_s(b) for b in batches]
        a, c = fit_affine(batches, times)
        worst = max(abs((a + c * b) / t - 1) for b, t in zip(batches, times, strict=True))
        assert worst > 0.05, (speed, worst)
        assert all(device.shape(b) >= 1.0 for b in range(1, 300))


@pytest.mark.parametrize("name", list(PRESETS))
def test_a_device_of_a_presets_speed_has_that_presets_published_curve(name):
    preset = PRESETS[name]
    speed = preset.peak_samples_per_s / 1e3
    for batch in (1, 3, 16, 48, 256):
        assert published_shape(speed, batch) == pytest.approx(preset.shape(batch))


def test_a_knee_or_fixed_cost_of_ones_own_replaces_the_published_curve():
    assert {Device(speed=3.0, knee_batch=1).shape(b) for b in range(1, 100)} == {1.0}
    own = Device(speed=3.0, knee_batch=16, fixed_samples=8)
    assert own.shape(4) == pytest.approx((16 + 8) / 4)
    assert WorkerSpec(name="w", speed=3.0).shape(8) == 1.0  # the host's curve by default
    published = WorkerSpec(name="w", speed=3.0, curve="published")
    assert published.shape(8) == pytest.approx(published_shape(3.0, 8))


def test_the_emulated_cluster_gives_each_rank_its_devices_time_with_its_own_noise():
    devices = [Device(speed=1.0), Device(speed=4.0, cliff_batch=48, cliff_factor=3.0)]
    noisy = EmulatedCluster(devices, NOISE_LEVELS["shared"], seed=3, stragglers=[(0, 50, 3.0)])
    again = EmulatedCluster(devices, NOISE_LEVELS["shared"], seed=3, stragglers=[(0, 50, 3.0)])
    assert noisy.step_times([32, 96], 60) == again.step_times([32, 96], 60)
    # a rank's time does not depend on the other ranks' batches
    assert noisy.step_times([32, 0], 60)[0] == noisy.step_times([32, 96], 60)[0]
    assert noisy.step_times([32, 0], 60)[1] == 0.0
    calm = EmulatedCluster(devices, stragglers=[(0, 50, 3.0, 10)])
    assert calm.step_times([32, 64], 70) == pytest.approx(
        [3.0 * devices[0].compute_s(32), devices[1].compute_s(64)]
    )
    assert calm.step_times([8, 8], 55)[0] < 3.0 * devices[0].compute_s(8)  # still drifting in
    # the ranks' noise is their own: two devices alike do not move together
    twins = EmulatedCluster([Device(speed=2.0)] * 2, NOISE_LEVELS["shared"], seed=1)
    rows = [twins.step_times([16, 16], s) for s in range(500)]
    assert sum(a != b for a, b in rows) == 500


def test_the_emulator_draws_its_noise_from_the_level_phase_by_phase():
    noise = _calm("shared")
    emu = Emulator(1.0, Link(None), noise=noise, seed=5)
    took = [emu.dilated(1.0, key=32) for _ in range(4000)]
    assert took[:50] == pytest.approx(_series(noise, 5, 50))
    assert _autocorrelation([math.log(t) for t in took], 1) > 0.2


def test_the_noise_level_sets_jitter_and_pauses_unless_the_cluster_gives_them():
    shared = ClusterSpec.from_speeds([1, 2], noise="shared")
    level = NOISE_LEVELS["shared"]
    assert (shared.jitter, shared.pauses) == (level.cv, level.pauses)
    assert shared.step_noise() == level
    own = ClusterSpec.from_speeds([1, 2], noise="shared", jitter=0.1)
    assert own.step_noise() == dataclasses.replace(level, cv=0.1)  # its stretches kept
    default = ClusterSpec.from_speeds([1, 2])
    assert default.step_noise() == NOISE_LEVELS[default.noise]
    # a job file's dump reads back as the same noise
    assert ClusterSpec.model_validate(own.model_dump()).step_noise() == own.step_noise()


@pytest.mark.parametrize(
    "data, field",
    [
        ({"noise": "loud"}, "noise"),
        ({"workers": [{"name": "a", "cliff_factor": 2.0}]}, "cliff_factor"),
        ({"workers": [{"name": "a", "cliff_batch": 16, "cliff_factor": 0.5}]}, "cliff_factor"),
        ({"workers": [{"name": "a", "cliff_batch": 0}]}, "cliff_batch"),
    ],
)
def test_a_bad_noise_level_or_cliff_is_refused_in_one_line_naming_the_field(data, field):
    with pytest.raises(ConfigError) as e:
        validated(ClusterSpec, {"workers": [{"name": "a"}], **data}, "cluster")
    assert field in str(e.value) and "\n" not in str(e.value)


def test_a_workers_cliff_reaches_its_emulated_shape():
    w = WorkerSpec(name="w", speed=2.0, knee_batch=1, cliff_batch=32, cliff_factor=2.5)
    assert (w.shape(32), w.shape(33)) == (1.0, 2.5)


def test_job_files_keep_three_field_stragglers_and_carry_ramps():
    from hetflow.training.launch.spec import RunSpec

    fields = RunSpec.model_fields["stragglers"]
    assert "ramp" in fields.description
    from pydantic import TypeAdapter

    adapter = TypeAdapter(fields.annotation)
    old, new = adapter.validate_json("[[3, 60, 4.0]]"), adapter.validate_json("[[3, 60, 4, 20]]")
    assert old == [(3, 60, 4.0)] and new == [(3, 60, 4.0, 20)]
    with pytest.raises(ValidationError):
        adapter.validate_json("[[3, 60]]")


def test_launching_fewer_ranks_renumbers_a_stragglers_ramp_with_it():
    cluster = ClusterSpec.from_speeds([1, 4, 2])
    ranks = RankMap(cluster, Plan(local_batches=[0, 48, 16], dropped=["w0"]))
    _, _, moved = ranks.launched([(2, 30, 3.0, 10), (1, 5, 2.0), (0, 1, 9.0)])
    assert moved == [(1, 30, 3.0, 10), (0, 5, 2.0)]


def test_bench_hetero_takes_a_noise_level_and_a_stragglers_ramp():
    from benchmarks.hetero import parse_args, parse_straggler

    _, bench = parse_args(["--noise", "shared", "--straggler", "3:60:4:20"])
    assert bench.cluster.step_noise() == NOISE_LEVELS["shared"]
    assert bench.stragglers == [(3, 60, 4.0, 20)]
    _, bench = parse_args(["--noise", "shared", "--jitter", "0.3", "--straggler", "3:60:4"])
    assert bench.cluster.jitter == 0.3 and bench.stragglers == [(3, 60, 4.0)]
    for bad in ("3:60", "3:60:4:x", "3:60:4:-1", "3:60:4:5:6"):
        with pytest.raises(ConfigError, match="--straggler"):
            parse_straggler(bad, 4)
    with pytest.raises((ConfigError, ValidationError), match="noise"):
        parse_args(["--noise", "loud"])


def test_the_ideal_of_a_run_with_a_drifting_straggler_lies_between_none_and_the_jump():
    from benchmarks.hetero import run_ideal
    from tests.profiles import profile_of, rank_profile

    profile = profile_of([rank_profile(r, s) for r, s in enumerate([100.0, 200.0, 400.0])])
    none = run_ideal(profile, 64, 100, [])
    jump = run_ideal(profile, 64, 100, [(2, 40, 4.0)])
    drift = run_ideal(profile, 64, 100, [(2, 40, 4.0, 30)])
    assert jump < drift < none
    assert run_ideal(profile, 64, 100, [(2, 40, 4.0, 0)]) == pytest.approx(jump)
    # a ramp that outlasts the run is cut at its end
    assert drift < run_ideal(profile, 64, 100, [(2, 40, 4.0, 500)]) < none
