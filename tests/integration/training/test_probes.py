"""Probes: the memory count and the compute probe in process; a real profile of 4 emulated
workers. The line fits are tested in test_fitting.py."""

from __future__ import annotations

import pytest

from hetflow.config import ClusterSpec, TrainConfig
from hetflow.flows.profile_cluster import print_profile_report, profile_report
from hetflow.records import Profile, RankProfile
from hetflow.training.launch.run import run_workers
from hetflow.training.launch.spec import RunSpec

SPEEDS = [1.0, 2.0, 3.0, 4.0]


SLOW_LINK = (1, 0.5)  # worker 1 has a 0.5 Gbit/s link; the others loopback


def profile_run(cluster: ClusterSpec, digits, tmp_path, train: TrainConfig):
    """A real profile of `cluster` under torchrun: (the run's result.json, its Profile)."""
    spec = RunSpec(
        run_name=cluster.name,
        variant="profile",
        mode="profile",
        cluster=cluster,
        dataset=digits,
        train=train,
        run_dir=str(tmp_path / "run"),
    )
    result, wall = run_workers(spec, timeout_s=150)
    return result, Profile.from_result(result, cluster, train.recipe, profiling_time_s=wall)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_profile_of_four_emulated_workers_rediscovers_speeds_and_the_slow_link(digits, tmp_path):
    cluster = ClusterSpec.from_speeds(SPEEDS, name="probe-test")
    cluster.workers[SLOW_LINK[0]].link_gbps = SLOW_LINK[1]
    for w in cluster.workers:  # the host's curve times the speed: the probes, not the shapes
        w.knee_batch = 1
    result, profile = profile_run(cluster, digits, tmp_path, TrainConfig())
    report = profile_report(profile, cluster)
    print_profile_report(report)
    # the bound is wider than the profiler's own goal: the ranks share this host's cores
    for w in report["workers"]:
        assert w["measured_speed"] == pytest.approx(w["emulated_speed"], rel=0.15), w
    slow = report["workers"][SLOW_LINK[0]]
    # goal 20%; the link runs on the emulated clock, time_scale times slower, as the compute
    assert slow["link_gbps_measured"] == pytest.approx(slow["link_gbps_emulated"], rel=0.25)
    assert slow["link_gbps_emulated"] == SLOW_LINK[1] / cluster.time_scale
    others = [w["link_gbps_measured"] for i, w in enumerate(report["workers"]) if i != SLOW_LINK[0]]
    assert min(others) > 2 * SLOW_LINK[1]  # loopback is much faster than the emulated link
    for r in result["ranks"]:
        RankProfile.model_validate(r)  # result.json: {"mode": "profile", "ranks": [RankProfile]}
        assert r["memory_cap_batch"] > 0 and r["memory_per_sample_bytes"] > 0
        assert r["matmul_gflops"] > 0 and r["memory_gbps"] > 0
        assert r["s3_first_byte_s"] > 0 and r["s3_read_mbps"] > 0
        assert set(r) >= {
            "samples_per_s",
            "fit_latency_s",
            "fit_s_per_sample",
            "grad_allreduce_s",
            "step_compute_s",
            "allreduce_latency_s",
            "allreduce_gbps",
        }
    # dilated raw figures follow the emulated speeds too (fastest / slowest = 4). The matmul
    # probe is a few ms long, so on a loaded machine (another test file's ranks beside these)
    # only its direction is asserted, past the noise.
    gflops = [r["matmul_gflops"] for r in sorted(result["ranks"], key=lambda r: r["rank"])]
    assert gflops[-1] / gflops[0] > 1.25
    assert result["mode"] == "profile" and {r["node"] for r in result["ranks"]} != {""}


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_profile_under_fsdp_steps_each_rank_sharded_and_tells_slow_from_fast(digits, tmp_path):
    """Each rank's probe steps the model sharded on a mesh of its own (FSDP2 over gloo). Under
    load the measured ratio drifts toward 1 (CI, loaded: 0.53 for an emulated 1/3; a quiet
    host: within 20%), likely wall time the emulator does not dilate (it dilates the rank
    thread's CPU time; gloo runs the solo mesh's collectives in a thread of its own), which
    both workers pay alike. So the test asks for the slow worker clearly slower."""
    cluster = ClusterSpec.from_speeds([1.0, 3.0], name="fsdp-probe")
    _, profile = profile_run(cluster, digits, tmp_path, TrainConfig(strategy="fsdp"))
    slow, fast = profile_report(profile, cluster)["workers"]
    assert fast["measured_speed"] == 1.0 and 0.2 < slow["measured_speed"] < 0.7, slow
    assert all(r.memory_cap_batch and r.allreduce_gbps for r in profile.ranks)
