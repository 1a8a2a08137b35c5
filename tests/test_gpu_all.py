"""benchmarks/gpu_all.py on the CPU side: the skip without CUDA, the plan of parts and their
commands (each one's flags as its own command parses them), the budget, the JSON it writes.
What the parts measure needs a GPU; nothing here runs one."""

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
NAMES = ["tests", "oom", "mps-bound", "mps-demo", "mixed", "demo-cuda", "cpus", "fsdp"]


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


def test_every_part_runs_on_a_gpu_host_within_8_minutes(tmp_path):
    parts = gpu_all.plan(tmp_path, GPU_HOST)
    assert [p.name for p in parts] == NAMES
    assert all(p.skip is None for p in parts)
    # the budget bounds every part with its SIGINT grace (run_all); 10 s for the script's own
    assert sum(p.timeout_s for p in parts) <= gpu_all.BUDGET_S <= 8 * 60 - 10
    for p in parts:  # each writes its figures in the run's folder
        assert p.figures is None or (p.figures.parent == tmp_path and str(p.figures) in p.argv)


def test_parts_whose_host_lacks_mps_or_cores_are_skipped_saying_why(tmp_path):
    parts = {p.name: p for p in gpu_all.plan(tmp_path, Host(cuda=True, mps=False, cores=8))}
    assert "nvidia-cuda-mps-control not found" in parts["mps-bound"].skip
    assert "nvidia-cuda-mps-control not found" in parts["mps-demo"].skip
    assert parts["cpus"].skip == "needs 15 cores, this host has 8"
    assert parts["tests"].skip is None and parts["fsdp"].skip is None


def _part(parts: list[Part], name: str) -> list[str]:
    argv = next(p.argv for p in parts if p.name == name)
    assert argv[:3] == [sys.executable, "-m", "hetflow.cli"]
    return argv[3:]


def test_the_bench_parts_are_commands_that_bench_accepts(tmp_path, monkeypatch):
    from benchmarks.fsdp import parse_args as fsdp_args
    from benchmarks.hetero import parse_args as hetero_args

    monkeypatch.setattr("benchmarks.hetero.hardware.mps_available", lambda: (True, "/x"))
    monkeypatch.setattr("benchmarks.hetero.hardware.host_cores", lambda: list(range(16)))
    parts = gpu_all.plan(tmp_path, GPU_HOST)
    _, mps = hetero_args(_part(parts, "mps-bound")[2:])
    assert [w.gpu_share for w in mps.cluster.workers] == list(gpu_all.SHARES)
    assert mps.bound and not mps.cluster.emulate
    assert {w.device for w in mps.cluster.workers} == {"cuda"}
    _, mixed = hetero_args(_part(parts, "mixed")[2:])
    assert [w.device for w in mixed.cluster.workers] == ["cuda", "cpu", "cpu", "cpu"]
    assert not mixed.cluster.emulate
    _, cpus = hetero_args(_part(parts, "cpus")[2:])
    assert [w.cpus for w in cpus.cluster.workers] == list(gpu_all.CPU_CORES)
    _, _, train = fsdp_args(_part(parts, "fsdp")[2:])
    assert train.recipe == "gpt" and train.recipe_options == {"size": "medium"}


def test_the_demo_parts_are_commands_the_cli_accepts_on_the_mps_cluster(tmp_path):
    parts = gpu_all.plan(tmp_path, GPU_HOST)
    assert build_parser().parse_args(_part(parts, "demo-cuda")).device == "cuda"
    demo = build_parser().parse_args(_part(parts, "mps-demo"))
    (tmp_path / "mps-cluster.yaml").write_text(gpu_all.mps_cluster_yaml())
    cluster = ClusterSpec.from_file(demo.cluster)
    assert [w.gpu_share for w in cluster.workers] == [10, 20, 30, 40]
    assert not cluster.emulate and cluster.jitter == 0 and cluster.pauses == 0


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
    assert gpu_all.main(["--out", str(out), "--only", "tests,fsdp"]) == 0
    written = json.loads(out.read_text())
    assert list(written["parts"]) == ["tests", "fsdp"] and written["budget_s"] == 470
    assert Path(tmp_path / "mps-cluster.yaml").exists()
    assert gpu_all.main(["--out", str(out), "--only", "nope"]) == 2
