"""Workers sharing a GPU by MPS (`WorkerSpec.gpu_share`), on the CPU side: the config, the
one-line refusals before launch, the daemon's commands and environment, each rank's share.
Only `subprocess.run` and the lookup of the binary are stood in for; the run on a GPU is
benchmarks/gpu_all.py's."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hetflow.config import ClusterSpec, ConfigError, WorkerSpec
from hetflow.training.launch import mps
from hetflow.training.launch import run as launch_run
from hetflow.training.launch.spec import RunSpec


def _cluster(*shares: int | None, **fields) -> ClusterSpec:
    workers = [WorkerSpec(name=f"w{i}", gpu_share=s) for i, s in enumerate(shares)]
    return ClusterSpec(workers=workers, **fields)


@pytest.mark.parametrize("share", [0, 101])
def test_a_share_outside_1_to_100_is_refused(share):
    with pytest.raises(ValueError, match="gpu_share"):
        WorkerSpec(name="w0", gpu_share=share)


def test_a_share_on_a_cpu_worker_is_refused():
    with pytest.raises(ValueError, match="gpu_share: a share of a GPU, but .* 'cpu'"):
        WorkerSpec(name="w0", gpu_share=10, device="cpu")


def test_the_share_is_read_from_a_cluster_file_and_left_out_of_the_form(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("workers:\n- {name: a, gpu_share: 10}\n- {name: b}\n")
    c = ClusterSpec.from_file(path)
    assert [w.gpu_share for w in c.workers] == [10, None]
    form = ClusterSpec.model_json_schema()["$defs"]["WorkerSpec"]["properties"]
    assert "cpus" not in form and "gpu_share" not in form and "device" in form


def test_no_share_no_check_and_no_daemon(monkeypatch):
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("ran a command"))
    c = _cluster(None, None)
    mps.check_mps(c, cuda_available=False, control=None)
    base = {"A": "1"}
    with mps.mps_daemon(c, base) as env:
        assert env is base


@pytest.mark.parametrize(
    "cuda, control, fields, said",
    [
        (True, None, {}, "MPS is not available here (nvidia-cuda-mps-control not found)"),
        (False, "/usr/bin/x", {}, "MPS is not available here (no CUDA device)"),
        (True, "/usr/bin/x", {"launcher": "ray"}, "MPS shares need the local launcher"),
    ],
)
def test_mps_where_it_cannot_run_is_refused_in_one_line_naming_the_worker(
    cuda, control, fields, said
):
    c = _cluster(None, 20, 30, **fields)
    with pytest.raises(ConfigError) as e:
        mps.check_mps(c, cuda_available=cuda, control=control)
    assert str(e.value).startswith(f"cluster.workers[w1].gpu_share: {said}")
    assert "\n" not in str(e.value)


def test_each_rank_gets_its_own_share():
    c = _cluster(10, None, 40)
    assert [mps.rank_env(c, r) for r in range(3)] == [
        {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "10"},
        {},
        {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "40"},
    ]


def test_apply_rank_env_sets_the_share_in_the_process(monkeypatch):
    monkeypatch.delenv(mps.SHARE_VAR, raising=False)
    mps.apply_rank_env(_cluster(None, 30), 1)
    assert os.environ[mps.SHARE_VAR] == "30"


class Calls:
    """subprocess.run stood in for: each call's command, stdin and MPS folders, and what it
    answers (`rc` per command's first word after the binary, default 0)."""

    def __init__(self, rc: dict[str, int] | None = None) -> None:
        self.seen: list[tuple[list[str], str | None, str, str]] = []
        self.rc = rc or {}

    def __call__(self, cmd, env, input, **kw):
        self.seen.append((cmd, input, env[mps.PIPE_VAR], env[mps.LOG_VAR]))
        assert Path(env[mps.PIPE_VAR]).is_dir() and Path(env[mps.LOG_VAR]).is_dir()
        rc = self.rc.get("quit" if input else "start", 0)
        return subprocess.CompletedProcess(cmd, rc, "", "boom\n" if rc else "")


def test_the_daemon_starts_and_quits_with_its_own_folders(monkeypatch):
    calls = Calls()
    monkeypatch.setattr(subprocess, "run", calls)
    with mps.mps_daemon(_cluster(10, 20), {"KEEP": "1"}) as env:
        assert env["KEEP"] == "1"
        root = Path(env[mps.PIPE_VAR]).parent
        assert root.name.startswith("hetflow-mps-") and root.is_dir()
        assert env[mps.LOG_VAR] == str(root / "log")
        assert [c[0] for c in calls.seen] == [["nvidia-cuda-mps-control", "-d"]]
    assert [(c[0], c[1]) for c in calls.seen] == [
        (["nvidia-cuda-mps-control", "-d"], None),
        (["nvidia-cuda-mps-control"], "quit\n"),
    ]
    assert calls.seen[0][2:] == calls.seen[1][2:] == (env[mps.PIPE_VAR], env[mps.LOG_VAR])
    assert not root.exists()
    assert not any("nvidia-smi" in c[0][0] or "-c" in c[0] for c in calls.seen)  # compute mode


def test_the_daemon_quits_when_the_job_fails_and_the_job_error_is_the_one_raised(monkeypatch):
    calls = Calls(rc={"quit": 1})  # even where quitting fails too
    monkeypatch.setattr(subprocess, "run", calls)
    with pytest.raises(KeyError, match="job"), mps.mps_daemon(_cluster(10), {}):
        raise KeyError("job")
    assert [c[1] for c in calls.seen] == [None, "quit\n"]


def test_a_daemon_that_does_not_start_is_one_line_and_starts_no_job(monkeypatch):
    calls = Calls(rc={"start": 1})
    monkeypatch.setattr(subprocess, "run", calls)
    with (
        pytest.raises(mps.MpsError, match=r"^nvidia-cuda-mps-control: could not start .*boom\)$"),
        mps.mps_daemon(_cluster(10), {}),
    ):
        pytest.fail("the block ran without a daemon")
    assert len(calls.seen) == 1


def test_the_launcher_refuses_before_writing_the_job(tmp_path, monkeypatch):
    from hetflow.config import DatasetSpec, TrainConfig

    monkeypatch.setattr(mps.shutil, "which", lambda name: None)
    spec = RunSpec(
        run_name="r",
        variant="profile",
        mode="profile",
        cluster=_cluster(None, 25, emulate=False),
        dataset=DatasetSpec(url="s3://b/d"),
        train=TrainConfig(recipe="digits-mlp", global_batch=4, steps=1),
        run_dir=str(tmp_path / "run"),
    )
    with pytest.raises(ConfigError, match=r"^cluster.workers\[w1\].gpu_share: MPS is not avail"):
        launch_run.run_workers(spec)
    assert not (tmp_path / "run").exists()


def test_bench_hetero_gives_each_worker_its_share_where_mps_runs(monkeypatch):
    from benchmarks.hetero import parse_args

    monkeypatch.setattr("benchmarks.hetero.hardware.mps_available", lambda: (True, "/usr/bin/x"))
    _, bench = parse_args(["--gpu-shares", "10,20,,40", "--devices", "cuda", "--no-emulate"])
    assert [w.gpu_share for w in bench.cluster.workers] == [10, 20, None, 40]


@pytest.mark.parametrize(
    "flag, said",
    [
        ("10,20,30", r"--gpu-shares: 4 shares of 1 to 100 \(or empty\) expected"),
        ("10,20,30,101", r"--gpu-shares: 4 shares of 1 to 100"),
        ("10,x,30,40", r"--gpu-shares: expected whole numbers"),
    ],
)
def test_bench_hetero_refuses_bad_shares_in_one_line(flag, said):
    from benchmarks.hetero import parse_args

    with pytest.raises(ConfigError, match=f"^{said}"):
        parse_args(["--gpu-shares", flag])


def test_bench_hetero_refuses_shares_where_mps_does_not_run(monkeypatch):
    from benchmarks.hetero import parse_args

    monkeypatch.setattr("benchmarks.hetero.hardware.mps_available", lambda: (False, None))
    with pytest.raises(ConfigError, match=r"^cluster.workers\[w0\].gpu_share: MPS is not avail"):
        parse_args(["--gpu-shares", "10,20,30,40"])
