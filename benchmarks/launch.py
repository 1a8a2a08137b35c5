"""The demo's launch, before and after: the same `hetflow demo` on two checkouts, alternating.

    python -m benchmarks.launch --base /path/to/base/checkout --runs 3 --json launch.json

Each run is `hetflow demo --speeds 3,1,2,1` (the flags after `--` replace those) in a fresh
HETFLOW_HOME, on the base checkout and on this one, the first of a pair alternating from one
pair to the next (`repeats.run_order`). `--cold` adds this checkout with the warm agent off
(HETFLOW_WARM_RANKS=0): the phases of a launch that imports per rank, as the base launches.

From each demo's JSON: both variants' `startup_s` and each worker's phases, the end-to-end gain
(`end_to_end_time_to_target_s`, baseline over optimized) and the steps' gain
(`time_to_target_s`), and their ratio, which the goal wants at least 0.9. The host's load
average is read before each run: other work on the host slows a launch more than its steps.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hetflow.repeats import run_order

ROOT = Path(__file__).resolve().parent.parent
DEMO = ["--speeds", "3,1,2,1"]


def demo_command(flags: list[str], out: Path) -> list[str]:
    return [sys.executable, "-m", "hetflow.cli", "demo", *flags, "--json", str(out)]


def one_run(variant: str, checkout: Path, flags: list[str], work: Path) -> dict:
    """One demo of `variant` on `checkout` in a fresh HETFLOW_HOME: its figures."""
    home = Path(tempfile.mkdtemp(prefix=f"launch-{variant}-", dir=work))
    out = home / "demo.json"
    env = {**os.environ, "HETFLOW_HOME": str(home), "PYTHONPATH": str(checkout)}
    if variant == "cold":  # this checkout with the warm agent off (`agents.WARM_RANKS`)
        env["HETFLOW_WARM_RANKS"] = "0"
    load = os.getloadavg()[0]
    t = time.perf_counter()
    done = subprocess.run(
        demo_command(flags, out), cwd=checkout, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"{variant}: demo failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return figures(json.loads(out.read_text()), variant, load, time.perf_counter() - t)


def figures(demo: dict, variant: str, load: float, wall_s: float) -> dict:
    """A demo's launch figures (pure): each variant's `startup_s`, the gains and their ratio.

    >>> t = {"startup_s": 5.0, "end_to_end_time_to_target_s": 20.0, "time_to_target_s": 12.0}
    >>> o = {"startup_s": 5.0, "end_to_end_time_to_target_s": 15.0, "time_to_target_s": 8.0}
    >>> f = figures({"baseline": t, "optimized": o}, "warm", 1.0, 60.0)
    >>> f["end_to_end_gain"], f["steps_gain"], round(f["gain_ratio"], 3)
    (1.3333333333333333, 1.5, 0.889)
    """
    b, o = demo["baseline"], demo["optimized"]

    def gain(name: str) -> float | None:
        return b[name] / o[name] if b.get(name) and o.get(name) else None

    e2e, steps = gain("end_to_end_time_to_target_s"), gain("time_to_target_s")
    return {
        "variant": variant,
        "load_1min": load,
        "demo_wall_s": wall_s,
        "startup_s": {"baseline": b.get("startup_s"), "optimized": o.get("startup_s")},
        "trials_s": o.get("trials_s"),
        "end_to_end_gain": e2e,
        "steps_gain": steps,
        "gain_ratio": e2e / steps if e2e and steps else None,
        "phases": demo.get("startup", {}),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True, type=Path, help="the checkout launched before")
    p.add_argument("--runs", type=int, default=3, help="pairs of runs (default 3)")
    p.add_argument("--cold", action="store_true", help="also this checkout, warm agent off")
    p.add_argument("--json", type=Path, help="write every run's figures here")
    p.add_argument("demo", nargs="*", help="the demo's flags, after -- (default the 3,1,2,1 mix)")
    args = p.parse_args(argv)
    variants = ("base", "warm", *(("cold",) if args.cold else ()))
    checkouts = {"base": args.base.resolve(), "warm": ROOT, "cold": ROOT}
    work = Path(tempfile.mkdtemp(prefix="bench-launch-"))
    runs = []
    for i in range(args.runs):
        for variant in run_order(variants, i):
            r = one_run(variant, checkouts[variant], args.demo or DEMO, work)
            runs.append({"pair": i, **r})
            print(json.dumps({k: v for k, v in runs[-1].items() if k != "phases"}), flush=True)
            if args.json:
                args.json.write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
