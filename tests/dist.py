"""Run a function on N real processes joined in a gloo process group, for the tests.

    results = run_ranks(train_runs, 4, runs, tmp_path)

`function(rank, world, arg)` must be importable by name (a module-level function of a module
under the repository root); `arg` and what it returns must be JSON. Each rank is a process of
its own with OMP_NUM_THREADS=1 and one torch thread, joined with the others in a gloo group
on loopback through a `FileStore` in `work_dir`. `run_ranks` returns the ranks' results in
rank order, or fails (`RankFailed`) with the traceback of the first rank that failed, once the
others are ended; a rank still running at `timeout_s` fails the call too.

The ranks are forked from a `multiprocessing` fork server that imports torch once for the
whole test session: starting 4 interpreters that each import torch costs several seconds of
this host's CPU per launch, and the method tests launch once per method.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
import traceback
from multiprocessing import forkserver
from pathlib import Path

# What the ranks of DDP tests import, imported once in the fork server.
_PRELOAD = [
    "torch",
    "torch.distributed",
    "torch.nn.parallel",
    "torch._dynamo",  # DDP imports it on construction
    "torch.distributed.optim",
    "torch.distributed.algorithms.model_averaging.averagers",
    "torch.distributed.algorithms.model_averaging.utils",
    "hetflow.training.comm",
]
_context = None


class RankFailed(AssertionError):
    """A rank raised, exited non-zero or ran out of time; the message says which and why."""


def _fork_server():
    """The forkserver context, its server started with OMP_NUM_THREADS=1 (read when torch
    loads there), which the pytest process itself keeps as it was."""
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(_PRELOAD)
        before = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"
        try:
            forkserver.ensure_running()
        finally:
            if before is None:
                del os.environ["OMP_NUM_THREADS"]
            else:
                os.environ["OMP_NUM_THREADS"] = before
    return _context


def run_ranks(function, world: int, arg, work_dir: Path, timeout_s: float = 120.0) -> list:
    """`function(rank, world, arg)` run on `world` gloo ranks; each rank's JSON result."""
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    ctx = _fork_server()
    procs = [
        ctx.Process(target=_rank_main, args=(function, rank, world, json.dumps(arg), str(work_dir)))
        for rank in range(world)
    ]
    for p in procs:
        p.start()
    try:
        failed = _wait(procs, timeout_s)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
    if failed is not None:
        raise RankFailed(_failure(function, work_dir, failed))
    return [json.loads((work_dir / f"rank{r}.json").read_text()) for r in range(world)]


def _wait(procs: list, timeout_s: float) -> str | None:
    """None once every process exited 0; else what stopped the run: the ranks that exited
    non-zero, or those still running at the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        codes = [p.exitcode for p in procs]
        failed = [rank for rank, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            return f"ranks {failed} exited non-zero"
        if all(code == 0 for code in codes):
            return None
        if time.monotonic() > deadline:
            running = [rank for rank, code in enumerate(codes) if code is None]
            return f"ranks {running} were still running after {timeout_s:g}s (ended)"
        time.sleep(0.05)


def _failure(function, work_dir: Path, why: str) -> str:
    """What went wrong: which rank stopped the run and how, the traceback of the rank that
    failed first (the others then typically fail on a broken connection), and the exception
    line of the others'."""
    lines = [f"{function.__qualname__}: {why}"]
    errors = sorted(work_dir.glob("rank*.err"), key=lambda f: f.stat().st_mtime_ns)
    if errors:
        first, *later = errors
        lines += [f"{first.stem} failed first:", first.read_text()[-4000:]]
        lines += [f"{err.stem} then: {_exception_line(err.read_text())}" for err in later]
    return "\n".join(lines)


def _exception_line(traceback_text: str) -> str:
    """A traceback's exception line: its last unindented `Type: message` line."""
    said = [line for line in traceback_text.splitlines() if line[:1].strip() and ": " in line]
    return said[-1][:300] if said else ""


def _rank_main(function, rank: int, world: int, arg: str, work_dir: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ["OMP_NUM_THREADS"] = "1"  # for what the rank starts in turn
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback
    torch.set_num_threads(1)
    out = Path(work_dir)
    try:
        store = dist.FileStore(str(out / "store"), world)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
        result = function(rank, world, json.loads(arg))
        (out / f"rank{rank}.json").write_text(json.dumps(result))
    except BaseException:
        # written before the group is torn down, which makes the other ranks fail too
        (out / f"rank{rank}.err").write_text(traceback.format_exc())
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
