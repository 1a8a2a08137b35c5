"""Workers given a kernel-enforced share of the CPU (`WorkerSpec.cpu_quota`): refused in one line
where the host cannot enforce it; otherwise each rank runs in a cgroup of its own, under its
quota as the kernel reports it, and the cgroups are gone after the job, also when a rank died."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hetflow.config import ConfigError, WorkerSpec
from hetflow.training.cpu_quota import (
    Controller,
    JobCgroups,
    check_quotas,
    find_controller,
    sweep,
)

from tests.helpers.training.cpu_quota import CONTROLLER, _cluster, needs_quotas


def test_a_quota_of_zero_or_less_is_refused_by_the_config_naming_the_field():
    with pytest.raises(ValueError, match="cpu_quota"):
        WorkerSpec(name="w0", cpu_quota=0)


def _mounts(tmp_path: Path, line: str = "") -> Path:
    mounts = tmp_path / "mounts"
    mounts.write_text(f"proc /proc proc rw 0 0\n{line}")
    return mounts


def test_no_controller_is_refused_naming_the_worker_and_what_is_missing(tmp_path):
    with pytest.raises(ConfigError, match=r"^cluster.workers\[w1\].cpu_quota: .*no cgroup CPU"):
        check_quotas(_cluster(None, 0.5), 2, _mounts(tmp_path))


def _fake_v1(tmp_path: Path) -> Path:
    root = tmp_path / "cpu"
    root.mkdir()
    (root / "cpu.cfs_quota_us").write_text("-1\n")
    return _mounts(tmp_path, f"cgroup {root} cgroup rw,cpu 0 0\n")


def test_a_controller_this_user_cannot_write_is_refused_in_one_line(tmp_path, monkeypatch):
    mounts = _fake_v1(tmp_path)
    # the kernel's answer for a user other than root (these tests run as root in CI)
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(ConfigError, match=r"^cluster.workers\[w0\].cpu_quota: .* not writable"):
        check_quotas(_cluster(0.25), 2, mounts)


def test_more_cores_than_the_host_has_are_refused_under_the_local_launcher(tmp_path):
    mounts = _fake_v1(tmp_path)
    with pytest.raises(ConfigError, match=r"^cluster.workers\[w1\].cpu_quota: 3 cores asked"):
        check_quotas(_cluster(1, 3), 2, mounts)
    assert check_quotas(_cluster(None, None), 2, mounts) is None
    assert check_quotas(_cluster(1, 1), 2, mounts) == Controller(tmp_path / "cpu", 1)


def test_the_v1_and_v2_mounts_are_found_from_the_mount_table(tmp_path):
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    v1.mkdir()
    v2.mkdir()
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    (v2 / "cgroup.controllers").write_text("cpuset cpu io memory\n")
    mounts = tmp_path / "mounts"
    mounts.write_text(f"cgroup2 {v2} cgroup2 rw 0 0\ncgroup {v1} cgroup rw,cpu,cpuacct 0 0\n")
    assert find_controller(mounts) == Controller(v1, 1)  # v1's cpu hierarchy first
    mounts.write_text(f"cgroup2 {v2} cgroup2 rw 0 0\n")
    assert find_controller(mounts) == Controller(v2, 2)
    (v2 / "cgroup.controllers").write_text("cpuset io memory\n")
    assert find_controller(mounts) is None  # v2 without its cpu controller


@needs_quotas
def test_a_jobs_cgroups_enforce_each_quota_and_are_removed_after():
    cgroups = JobCgroups.of(_cluster(0.5, None, 0.25), "hf-test-job", CONTROLLER)
    with cgroups:
        job = CONTROLLER.job_dir("hf-test-job")
        assert sorted(p.name for p in job.iterdir() if p.is_dir()) == ["rank0", "rank2"]
        assert CONTROLLER.read_quota(job / "rank0") == 0.5
        assert CONTROLLER.read_quota(job / "rank2") == 0.25
    assert not job.exists()


@needs_quotas
def test_a_stale_empty_cgroup_is_swept_and_one_in_use_is_not(tmp_path):
    from hetflow.training.cpu_quota import make_rank_cgroup

    stale = make_rank_cgroup(CONTROLLER, "hf-test-stale", 0, 0.5)
    fresh = make_rank_cgroup(CONTROLLER, "hf-test-fresh", 0, 0.5)
    try:
        sweep(CONTROLLER, older_than_s=1e9)  # none old enough: both stay
        assert stale.exists() and fresh.exists()
        sweep(CONTROLLER, older_than_s=-1)
        assert not stale.exists() and not stale.parent.exists() and not fresh.exists()
    finally:
        for p in (stale, stale.parent, fresh, fresh.parent):
            if p.exists():
                p.rmdir()
