"""benchmarks/gpu_all.py on the CPU side: the skip without CUDA, the plan of parts and their
commands (each one's argv as its own command parses it), the timeouts' sum and the budget,
the JSON it writes. What the parts measure needs a GPU; nothing here runs one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from hetflow.cli import build_parser
from hetflow.config import ClusterSpec

from benchmarks import gpu_all
from benchmarks.gpu_all import Host, Part

GPU_HOST = Host(cuda=True, mps=True, cores=16)
NAMES = ["tests", "oom", "mps-learner", "mixed-learner", "mps-demo"]


def test_without_cuda_it_says_so_in_one_line_writes_the_json_and_runs_nothing(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(gpu_all, "host_here", lambda: Host(cuda=False, mps=False, cores=2))
    monkeypatch.setattr(gpu_all.subprocess, "Popen", lambda *a, **k: pytest.fail("ran"))
    out = tmp_path / "g.json"
    assert gpu_all.main(["--out", str(out)]) == 0
    said = capsys.readouterr().out.strip().splitlines()
    assert len(said) == 1 and "no CUDA device here" in said[0] and "skipped" in said[0]
    written = json.loads(out.read_text())
    assert written["skipped"] == "no CUDA device here" and "parts" not in written
    assert written["host"] == {"cuda": False, "mps": False, "cores": 2}


def test_every_part_runs_on_a_gpu_host_and_the_timeouts_sum_under_7_minutes(tmp_path):
    parts = gpu_all.plan(tmp_path, GPU_HOST)
    assert [p.name for p in parts] == NAMES
    assert all(p.skip is None for p in parts)
    assert sum(p.timeout_s for p in parts) < gpu_all.PARTS_S <= 7 * 60
    # the budget: every timeout, and the SIGINT grace of some parts cut off (run_all bounds
    # each part by what is left); 10 s for the script's own start, under 8 minutes
    assert gpu_all.PARTS_S < gpu_all.BUDGET_S <= 8 * 60 - 10
    for p in parts:  # each writes its figures in the run's folder
        assert p.figures is None or (p.figures.parent == tmp_path and str(p.figures) in p.argv)


def test_parts_whose_host_lacks_mps_are_skipped_saying_why(tmp_path):
    parts = {p.name: p for p in gpu_all.plan(tmp_path, Host(cuda=True, mps=False, cores=2))}
    for name in ("mps-learner", "mps-demo"):
        assert "nvidia-cuda-mps-control not found" in parts[name].skip
    assert all(parts[n].skip is None for n in ("tests", "oom", "mixed-learner"))


def _accepts(argv: list[str], tmp_path: Path, monkeypatch) -> object:
    """`argv` parsed by the command it runs, as that command parses it: pytest's files exist,
    this module's flags, `hetflow bench hetero` by its own `parse_args` (which also builds the
    cluster and checks the job; MPS and 16 cores faked as on the GPU host), `hetflow demo` by
    the CLI's parser and its cluster file; any other command fails the test."""
    from benchmarks.hetero import parse_args as hetero_args

    assert argv[:2] == [sys.executable, "-m"]
    module, rest = argv[2], argv[3:]
    if module == "pytest":
        files = [a for a in rest if not a.startswith("-") and rest[rest.index(a) - 1] != "-p"]
        assert files and all((gpu_all.ROOT / f).is_file() for f in files), files
        return files
    if module == "benchmarks.gpu_all":
        return gpu_all.parser().parse_args(rest)
    assert module == "hetflow.cli", argv
    if rest[:2] == ["bench", "hetero"]:
        monkeypatch.setattr("benchmarks.hetero.hardware.mps_available", lambda: (True, "/x"))
        monkeypatch.setattr("benchmarks.hetero.hardware.host_cores", lambda: list(range(16)))
        return hetero_args(rest[2:])[1]
    assert rest[0] == "demo", argv
    demo = build_parser().parse_args(rest)
    (tmp_path / "mps-cluster.yaml").write_text(gpu_all.mps_cluster_yaml())
    if demo.cluster:
        ClusterSpec.from_file(demo.cluster)
    return demo


def test_every_parts_command_is_accepted_by_the_command_it_runs(tmp_path, monkeypatch):
    for part in gpu_all.plan(tmp_path, GPU_HOST):
        _accepts(part.argv, tmp_path, monkeypatch)


def test_the_learner_runs_without_a_profile_on_the_mps_shares_and_beside_cpu_workers(
    tmp_path, monkeypatch
):
    """The learner is the `dynamic` schedule with no profile first: the bench's `dynamic`
    variant (not `dynamic@profile`) and the demo's optimized variant."""
    from hetflow.config import TrainConfig
    from hetflow.training.metrics import needs_profile

    parts = {p.name: p for p in gpu_all.plan(tmp_path, GPU_HOST)}
    mps = _accepts(parts["mps-learner"].argv, tmp_path, monkeypatch)
    assert [w.gpu_share for w in mps.cluster.workers] == list(gpu_all.SHARES)
    assert {w.device for w in mps.cluster.workers} == {"cuda"}
    assert mps.bound and not mps.cluster.emulate and "dynamic" in mps.variants
    mixed = _accepts(parts["mixed-learner"].argv, tmp_path, monkeypatch)
    assert [w.device for w in mixed.cluster.workers] == ["cuda", "cpu", "cpu", "cpu"]
    assert not mixed.cluster.emulate and "dynamic" in mixed.variants
    dynamic = mixed.base.model_copy(update={"schedule": "dynamic"})
    assert not needs_profile(dynamic)  # as the bench's `dynamic` variant runs it
    demo = _accepts(parts["mps-demo"].argv, tmp_path, monkeypatch)
    cluster = ClusterSpec.from_file(demo.cluster)
    assert [w.gpu_share for w in cluster.workers] == list(gpu_all.SHARES)
    assert not cluster.emulate and cluster.jitter == 0 and cluster.pauses == 0
    optimized = TrainConfig.variant("optimized", profile_first=demo.profile_first)
    assert optimized.schedule == "dynamic" and not needs_profile(optimized)


def test_the_test_part_reports_pytests_counts():
    text = "F.\n1 failed, 17 passed, 2 skipped in 90.50s (0:01:30)\n"
    assert gpu_all.parse_pytest(text) == {"failed": 1, "passed": 17, "skipped": 2, "seconds": 90.5}
    assert gpu_all.parse_pytest("ImportError: boom\n") == {}


def test_the_budget_cuts_each_timeout_and_skips_what_no_longer_fits():
    now = [0.0]
    seen: list[tuple[str, float]] = []

    def runner(part, timeout_s):
        seen.append((part.name, timeout_s))
        now[0] += timeout_s  # every part runs to its timeout
        return {"rc": 124}

    parts = [Part(n, n, 100, ["x"]) for n in "abc"] + [Part("d", "d", 5, ["x"], skip="no MPS")]
    writes = []
    out = gpu_all.run_all(parts, 150, writes.append, runner, clock=lambda: now[0])
    left = 150 - 100 - gpu_all.GRACE_S
    assert seen == [("a", 100), ("b", left)]
    assert out["c"] == {"what": "c", "skipped": "out of the 150 s budget"}
    assert out["d"] == {"what": "d", "skipped": "no MPS"}
    assert len(writes) == 4 and list(writes[-1]) == ["a", "b", "c", "d"]


def test_a_part_gives_rc_wall_time_figures_and_its_last_lines(tmp_path):
    code = "print('log'); print('{\"cap\": 7}')"
    got = gpu_all.run_part(Part("oom", "w", 30, [sys.executable, "-c", code]), 30)
    assert got["rc"] == 0 and got["figures"] == {"cap": 7} and got["output_tail"][0] == "log"
    assert set(got) == {"what", "command", "rc", "wall_s", "timeout_s", "figures", "output_tail"}
    figures = tmp_path / "f.json"
    figures.write_text('{"a": 1}')
    got = gpu_all.run_part(Part("x", "w", 30, [sys.executable, "-c", "1"], figures), 30)
    assert got["figures"] == {"a": 1}


def test_a_part_past_its_timeout_is_stopped_with_rc_124(monkeypatch):
    monkeypatch.setattr(gpu_all, "GRACE_S", 1.0)
    code = "import time; print('started', flush=True); time.sleep(60)"
    got = gpu_all.run_part(Part("x", "w", 1, [sys.executable, "-c", code]), 1.0)
    assert got["rc"] == 124 and got["wall_s"] < 10 and got["figures"] is None


def test_on_a_gpu_host_the_json_holds_every_part(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_all, "host_here", lambda: GPU_HOST)
    monkeypatch.setattr(gpu_all, "run_part", lambda p, t: {"rc": 0, "timeout_s": t})
    out = tmp_path / "g.json"
    assert gpu_all.main(["--out", str(out), "--only", "tests,mixed-learner"]) == 0
    written = json.loads(out.read_text())
    assert list(written["parts"]) == ["tests", "mixed-learner"]
    assert written["budget_s"] == gpu_all.BUDGET_S
    assert Path(tmp_path / "mps-cluster.yaml").exists()
    assert gpu_all.main(["--out", str(out), "--only", "nope"]) == 2
