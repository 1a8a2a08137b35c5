"""The CPU a launch costs, cold against warm: the same short job under torchrun with a fresh
interpreter per rank, and under the warm agent (`training/launch/warm.py`), alternating.

    python -m benchmarks.launch_cpu --pairs 3 --json launch_cpu.json

The job: the demo's cluster (3,1,2,1, emulated), digits-cnn, 3 steps, on digits written to a
local folder (no S3 endpoint to share the host with). Each launch's CPU seconds are every
process it started (`RUSAGE_CHILDREN`: the agent and its ranks), user and system; on a host
other work loads, they move far less than its wall time, which is reported beside them.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import tempfile
import time
from pathlib import Path

from hetflow.config import ClusterSpec, DatasetSpec, TrainConfig
from hetflow.infra.data.format import digits_source, write_dataset
from hetflow.infra.s3 import free_port
from hetflow.records import Plan
from hetflow.repeats import run_order
from hetflow.training.launch.local import torchrun_command, worker_env
from hetflow.training.launch.spec import RunSpec


def job(work: Path, name: str) -> RunSpec:
    """The short job, its files under `work/name`, its dataset under `work/digits`."""
    data = work / "digits"
    if not (data / "manifest.json").exists():
        (data / "train").mkdir(parents=True)
        (data / "test").mkdir()
        spec = DatasetSpec(url=data.as_uri(), cache_dir=str(work / "cache"))
        write_dataset(spec.url, digits_source(spec.test_fraction, spec.seed), spec.shard_samples)
    dataset = DatasetSpec(url=data.as_uri(), cache_dir=str(work / "cache"))
    run_dir = work / name
    run_dir.mkdir()
    return RunSpec(
        run_name=name,
        variant=name,
        cluster=ClusterSpec.from_speeds([3, 1, 2, 1], time_scale=8.0),
        dataset=dataset,
        train=TrainConfig(recipe="digits-cnn", global_batch=128, steps=3, compression="none"),
        plan=Plan.equal([32] * 4),
        run_dir=str(run_dir),
        submitted_at=time.time(),
    )


def launch(spec: RunSpec, warm: bool) -> dict:
    """One launch to its end: CPU seconds of every process it started, and wall seconds."""
    path = spec.write(Path(spec.run_dir) / "job.json")
    cmd = torchrun_command(path, 4, f"127.0.0.1:{free_port()}", warm=warm)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(cmd, env=worker_env(spec), check=True, capture_output=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    result = json.loads((Path(spec.run_dir) / "result.json").read_text())
    first = [r["timeline"]["first_step_s"] for r in result["ranks"]]
    return {"cpu_s": cpu, "wall_s": wall, "startup_s": max(first)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-launch-cpu-"))
    runs = []
    for i in range(args.pairs):
        for variant in run_order(("cold", "warm"), i):
            got = launch(job(work, f"{variant}-{i}"), warm=variant == "warm")
            runs.append({"pair": i, "variant": variant, **got})
            print(json.dumps(runs[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
