"""`hetflow bench gpu_all`: every GPU figure of one GPU host in one call, into one JSON file.

    hetflow bench gpu_all                        # JSON under a new run folder ($HETFLOW_HOME/runs)
    python -m benchmarks.gpu_all --out gpu.json  # the same, from the repository's root
    hetflow bench gpu_all --only mps-learner,oom  # some parts again

The contract:

- Where torch sees no CUDA device it prints one line saying it skips, writes a JSON saying so
  and exits 0, having run nothing.
- Otherwise it runs the parts (`plan`, in that order), each an existing command (pytest,
  `hetflow demo`, `hetflow bench hetero`, or this module's `--oom-search`) in a subprocess of
  its own from the repository's root, one after another (they share the GPU and the cores).
  Each runs under its own timeout, cut to what is left of `--budget-s` (`BUDGET_S`: the whole
  under 8 minutes); a part that no longer fits, or whose host lacks what it needs (MPS), is
  skipped and says why. A part past its timeout gets SIGINT (the MPS daemon's clean-up runs),
  then SIGKILL, and its rc is 124.
- Per part the JSON holds: what it measures, the command, rc, wall seconds, its figures (the
  JSON file the command wrote, or what is parsed from its output) and its output's last lines;
  or `skipped` and why. The file is written after every part, so a cut-off call keeps the
  parts it finished. The exit status is 0 once the file is written; each rc says how its part
  went.

Each part's timeout is its expected wall time (launches, Prefect's start, the solo runs of
the bound, as measured on a GPU host) with a margin, and the timeouts sum under `PARTS_S`;
steps and variants were cut to fit, not left to the timeout. The sizing and the runs it comes
from: docs/measurements/gpu.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PARTS_S = 420.0  # the parts' timeouts sum under this (7 minutes)
BUDGET_S = 465.0  # every part with the SIGINT grace of those cut off: the call under 8 minutes
GRACE_S = 15.0  # after SIGINT, before SIGKILL
MIN_PART_S = 10.0  # a part with less than this left is skipped
TAIL_LINES = 15
SHARES = (10, 20, 30, 40)  # MPS's active-thread percentages of the 4-worker cluster
LEARNER_STEPS = 60  # steps cost little beside a launch (docs/measurements/gpu.md)
OOM_LIMIT_GIB = 2.0  # the memory the out-of-memory search may use


@dataclass(frozen=True)
class Host:
    """What the parts need of this host: CUDA, MPS's control binary; and how many cores (for
    the record)."""

    cuda: bool
    mps: bool
    cores: int


@dataclass(frozen=True)
class Part:
    """One command and what it measures; `figures` is the JSON file it writes, if any;
    `skip` says why it does not run on this host (None: it runs)."""

    name: str
    what: str
    timeout_s: float
    argv: list[str]
    figures: Path | None = None
    skip: str | None = None


def hetflow(*args: str) -> list[str]:
    return [sys.executable, "-m", "hetflow.cli", *args]


def mps_cluster_yaml() -> str:
    """The 4-worker cluster of MPS shares on one GPU, real speeds (no emulation, no noise)."""
    workers = "".join(f"  - {{name: mps{s}, device: cuda, gpu_share: {s}}}\n" for s in SHARES)
    return f"name: mps-shares\nemulate: false\njitter: 0\npauses: 0\nworkers:\n{workers}"


def plan(out: Path, host: Host) -> list[Part]:
    """The parts, in the order they run, their commands writing under `out` (pure). The
    learner is the `dynamic` schedule with no profile first (the bench's `dynamic` variant,
    the demo's optimized one), beside the equal split."""
    no_mps = None if host.mps else "MPS is not available here (nvidia-cuda-mps-control not found)"
    shares = ",".join(map(str, SHARES))
    hetero = ("bench", "hetero", "--speeds", "1,1,1,1", "--no-emulate")
    learner = ("--variants", "baseline,dynamic", "--steps", str(LEARNER_STEPS))
    return [
        Part("tests", "the tests marked cuda, and the device checks", 75,
             [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
              "tests/integration/training/test_cuda.py", "tests/unit/training/test_devices.py",
              "tests/integration/training/test_devices.py"]),
        Part("oom", f"the out-of-memory search under a {OOM_LIMIT_GIB:g} GiB limit", 30,
             [sys.executable, "-m", "benchmarks.gpu_all", "--oom-search"]),
        Part("mps-learner", f"the learner and the equal split on MPS shares {shares}% as 4 "
             "workers, each worker also alone at its batch (--bound)", 140,
             hetflow(*hetero, "--devices", "cuda", "--gpu-shares", shares, "--bound", *learner,
                     "--jitter", "0", "--pauses", "0", "--json", str(out / "mps-learner.json")),
             out / "mps-learner.json", no_mps),
        Part("mixed-learner", "the learner and the equal split, one CUDA worker beside 3 CPU "
             "workers, no emulation", 80,
             hetflow(*hetero, "--devices", "cuda,cpu,cpu,cpu", *learner,
                     "--json", str(out / "mixed-learner.json")),
             out / "mixed-learner.json"),
        Part("mps-demo", f"the demo (Prefect, MLflow; optimized is the learner) on the MPS "
             f"shares {shares}%", 80,
             hetflow("demo", "--cluster", str(out / "mps-cluster.yaml"), "--steps", "30",
                     "--profile-max-age-h", "0", "--json", str(out / "mps-demo.json")),
             out / "mps-demo.json", no_mps),
    ]  # fmt: skip


def parse_pytest(text: str) -> dict:
    """pytest's summary line as figures (pure): counts by outcome and seconds.

    >>> parse_pytest("..s\\n17 passed, 1 skipped in 96.20s (0:01:36)\\n")
    {'passed': 17, 'skipped': 1, 'seconds': 96.2}
    """
    lines = [ln for ln in text.splitlines() if re.search(r" in [\d.]+s", ln)]
    if not lines:
        return {}
    last = lines[-1]
    out: dict = {k: int(n) for n, k in re.findall(r"(\d+) (\w+)", last.split(" in ")[0])}
    out["seconds"] = float(re.search(r" in ([\d.]+)s", last).group(1))
    return out


def figures_of(part: Part, output: str) -> dict | None:
    """The part's figures: its JSON file where it wrote one, else what its output says."""
    if part.figures is not None:
        try:
            return json.loads(part.figures.read_text())
        except (OSError, ValueError):
            return None
    if part.name == "tests":
        return parse_pytest(output)
    lines = [ln for ln in output.splitlines() if ln.startswith("{")]
    try:
        return json.loads(lines[-1]) if lines else None
    except ValueError:
        return None


def run_part(part: Part, timeout_s: float) -> dict:
    """Run one part to its end or its timeout: rc (124 past it), wall seconds, figures, and
    the last lines of its output."""
    t = time.monotonic()
    proc = subprocess.Popen(
        part.argv,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: the ranks end with it
    )
    try:
        output, _ = proc.communicate(timeout=timeout_s)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        output = _stop(proc)
        rc = 124
    return {
        "what": part.what,
        "command": part.argv,
        "rc": rc,
        "wall_s": round(time.monotonic() - t, 2),
        "timeout_s": round(timeout_s, 1),
        "figures": figures_of(part, output),
        "output_tail": output.strip().splitlines()[-TAIL_LINES:],
    }


def _stop(proc: subprocess.Popen) -> str:
    """SIGINT to the part's process group (so that the MPS daemon is told to quit), then
    SIGKILL after GRACE_S; what it wrote."""
    for sig, wait in ((signal.SIGINT, GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            return proc.communicate(timeout=wait)[0] or ""
        except subprocess.TimeoutExpired:
            continue
    return ""


def run_all(parts: list[Part], budget_s: float, write, runner=run_part, clock=time.monotonic):
    """Every part in order within `budget_s`, calling `write(results)` after each; each part's
    timeout is its own or what is left of the budget (less the SIGINT grace), if smaller."""
    deadline = clock() + budget_s
    results: dict = {}
    for part in parts:
        left = deadline - clock() - GRACE_S
        if part.skip is not None:
            results[part.name] = {"what": part.what, "skipped": part.skip}
        elif left < MIN_PART_S:
            results[part.name] = {"what": part.what, "skipped": f"out of the {budget_s:g} s budget"}
        else:
            results[part.name] = runner(part, min(part.timeout_s, left))
        write(results)
    return results


def write_json(path: Path, out: dict) -> None:
    """The figures at `path`, quietly (it is written after every part)."""
    path.write_text(json.dumps(out, indent=1, default=str))


def host_here() -> Host:
    from hetflow.training.cores import host_cores
    from hetflow.training.launch.mps import mps_available

    cuda, control = mps_available()
    return Host(cuda=cuda, mps=control is not None, cores=len(host_cores()))


def oom_search(limit_gib: float = OOM_LIMIT_GIB) -> dict:
    """The out-of-memory search (`largest_fitting` over `fits_on_device`, no headroom: what
    `cuda_cap_batch` finds) for gpt's default size on a GPU this process may use `limit_gib`
    of, then checked: the cap fits and cap + 1 does not, each tried once more after the
    search (`found_the_cap` only then). `tries`: the batches the search tried, in order."""
    import numpy as np
    import torch

    from hetflow.training.probes.memory import fits_on_device, largest_fitting
    from hetflow.training.recipes import DataInfo, get_recipe, seeded_model

    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, limit_gib * 2**30 / total), 0)
    recipe = get_recipe("gpt")
    model = seeded_model(recipe, DataInfo(kind="tokens", vocab=256), 0).to("cuda")
    x = np.random.default_rng(0).integers(0, 256, (64, recipe.context + 1))
    y = np.zeros(64, dtype=np.int64)
    tries: list[int] = []

    def fits(batch: int) -> bool:
        tries.append(batch)
        return fits_on_device(model, x, y, recipe, batch)

    t = time.monotonic()
    cap = largest_fitting(fits, limit=1 << 14)
    search_s = time.monotonic() - t
    at, above = (fits_on_device(model, x, y, recipe, b) for b in (cap, cap + 1))
    return {"limit_gib": limit_gib, "cap": cap, "search_s": round(search_s, 2),
            "tries": tries, "fits_at_cap": at, "fits_at_cap_plus_1": above,
            "found_the_cap": at and not above}  # fmt: skip


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hetflow bench gpu_all", description=__doc__.splitlines()[0])
    p.add_argument("--out", help="the JSON file (default: gpu_all.json in a new run folder)")
    p.add_argument(
        "--budget-s",
        type=float,
        default=BUDGET_S,
        dest="budget_s",
        help=f"every part within this many seconds (default {BUDGET_S:g})",
    )
    p.add_argument("--only", help="these parts only, comma-separated (default: every part)")
    p.add_argument(
        "--oom-search",
        action="store_true",
        dest="oom_search",
        help="run the out-of-memory part here and print its figures (one JSON line)",
    )
    return p  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.oom_search:
        print(json.dumps(oom_search()))
        return 0
    from hetflow.infra.paths import new_run_dir

    out = Path(args.out) if args.out else new_run_dir("gpu-all") / "gpu_all.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    host = host_here()
    head = {"host": vars(host), "budget_s": args.budget_s}
    if not host.cuda:
        write_json(out, {**head, "skipped": "no CUDA device here"})
        print(f"gpu_all: no CUDA device here, every part skipped ({out})")
        return 0
    (out.parent / "mps-cluster.yaml").write_text(mps_cluster_yaml())
    parts = plan(out.parent, host)
    if args.only:
        names = set(args.only.split(","))
        unknown = names - {p.name for p in parts}
        if unknown:
            print(f"--only: unknown {sorted(unknown)}; parts: {[p.name for p in parts]}")
            return 2
        parts = [p for p in parts if p.name in names]
    run_all(parts, args.budget_s, lambda r: write_json(out, {**head, "parts": r}), run_part)
    print(f"gpu_all: {len(parts)} parts written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
