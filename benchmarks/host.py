"""`hetflow bench host`: what this host itself costs an emulated cluster, apart from any plan.

    hetflow bench host --json host.json
    hetflow bench host --worlds 2,4,8 --batches 13,29,32,41,64 --passes 3
    hetflow bench host --worlds 4,4,4 --gloo-threads 2,1   # gloo's threads, alternated

Two figures that bound `hetflow bench hetero` and `hetflow demo` on a small CPU host:

- `allreduce`: gloo's all-reduce of the digits-cnn gradient among W processes on this host,
  timed from the last rank's arrival (the ranks arrive after a pause, as after an emulated
  compute phase) to the last rank's return, and the CPU time each process spent per
  all-reduce (with the barrier before it). No plan can shorten it: it is paid every step
  after the slowest rank computes. With `--gloo-threads`, every world size runs once with each
  count of gloo's worker threads per process (`ProcessGroupGloo` options, 2 in torch).
  Beside it, `tcp_ring_chain_ms`: a one-byte token passed around a ring of W processes over
  plain loopback TCP (after the same pause), per hop, times the 2(W-1) hops of a ring
  all-reduce: what the messages cost this host's sockets and scheduler without gloo.
- `compute`: the least CPU time of one digits-cnn step (forward and backward, one thread) at
  each batch, in `--passes` passes a few seconds apart: how far the host's cost of the same
  step moves between passes (what a profile measured and what training then runs at), and
  how far it lies from a line through the batches (a step is not affine in its batch).

Figures: docs/measurements/host.md.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hetflow.cli.args import Parser
from hetflow.config import ConfigError
from hetflow.infra.s3 import free_port
from hetflow.perf.fitting import robust_affine
from hetflow.training.recipes import DataInfo, get_recipe

from benchmarks import write_json

REPS, SKIP = 40, 5  # all-reduces per world size, and the first ones left out (warm-up)
PAUSE_S = 0.02  # each rank's pause before an all-reduce, as an emulated compute phase ends
STEP_REPS = 15  # steps per batch and pass (the least is kept, as the emulator keeps)


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="hetflow bench host", description=__doc__.split("\n")[0])
    p.add_argument("--worlds", default="2,3,4,5,8", help="processes per all-reduce, e.g. 2,4,8")
    p.add_argument(
        "--batches", default="8,13,16,29,32,38,41,64,77", help="batches the step is timed at"
    )
    p.add_argument("--passes", type=int, default=2, help="passes over the batches (>= 1)")
    p.add_argument(
        "--gloo-threads",
        dest="gloo_threads",
        default="2",
        help="gloo worker threads per process, each tried in turn, e.g. 2,1 (default: torch's 2)",
    )
    p.add_argument("--json", dest="json_path", help="write the figures here")
    return p


def _ints(flag: str, text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x]
    except ValueError:
        raise ConfigError(f"{flag}: expected integers separated by commas (got {text!r})") from None
    if not out or min(out) < 1:
        raise ConfigError(f"{flag}: expected integers of at least 1 (got {text!r})")
    return out


def _cnn() -> torch.nn.Module:
    return get_recipe("digits-cnn").build_model(DataInfo())


def _allreduce_rank(rank: int, world: int, port: int, numel: int, threads: int, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    opts = dist.ProcessGroupGloo._Options()
    opts._threads = threads
    opts._devices = [dist.ProcessGroupGloo.create_default_device()]
    dist.init_process_group("gloo", rank=rank, world_size=world, pg_options=opts)
    buf, times = torch.zeros(numel), []
    cpu = time.process_time()
    for i in range(REPS):
        if i == SKIP:
            cpu = time.process_time()
        dist.barrier()
        time.sleep(PAUSE_S)
        began = time.perf_counter()  # CLOCK_MONOTONIC: one clock for every process here
        dist.all_reduce(buf)
        times.append((began, time.perf_counter()))
    out[rank] = (times[SKIP:], (time.process_time() - cpu) / (REPS - SKIP))
    dist.destroy_process_group()


def allreduce(world: int, numel: int, port: int, threads: int = 2) -> dict:
    """One world size's all-reduce figures (W real processes, gloo on loopback, `threads`
    worker threads each)."""
    out = mp.Manager().dict()
    # forked: `benchmarks` is loaded from the checkout, which a spawned child cannot import
    args = (world, port, numel, threads, out)
    mp.start_processes(_allreduce_rank, args=args, nprocs=world, start_method="fork")
    ranks = [out[r] for r in range(world)]
    took = [
        max(r[0][i][1] for r in ranks) - max(r[0][i][0] for r in ranks) for i in range(REPS - SKIP)
    ]
    return {
        "world": world,
        "gloo_threads": threads,
        "bytes": numel * 4,
        "median_ms": statistics.median(took) * 1e3,
        "p90_ms": sorted(took)[int(0.9 * len(took))] * 1e3,
        "cpu_ms_per_process": statistics.mean(r[1] for r in ranks) * 1e3,
        "tcp_ring_chain_ms": tcp_ring_chain_ms(world),
    }


def _ring_rank(rank: int, world: int, listeners: list[socket.socket], out) -> None:
    nxt = socket.create_connection(listeners[(rank + 1) % world].getsockname())
    nxt.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    prev = listeners[rank].accept()[0]
    laps = []
    for _ in range(REPS):
        if rank == 0:
            time.sleep(PAUSE_S)
            began = time.perf_counter()
            nxt.sendall(b"t")
            prev.recv(1)
            laps.append(time.perf_counter() - began)
        else:
            prev.recv(1)
            nxt.sendall(b"t")
    if rank == 0:
        out[0] = laps[SKIP:]


def tcp_ring_chain_ms(world: int) -> float:
    """The median lap of a token around W processes over loopback TCP, per hop, times the
    2(W-1) hops of a ring all-reduce (ms)."""
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(world)]
    out = mp.Manager().dict()
    mp.start_processes(_ring_rank, args=(world, listeners, out), nprocs=world, start_method="fork")
    for s in listeners:
        s.close()
    return statistics.median(out[0]) / world * 2 * (world - 1) * 1e3


def compute(batches: list[int], passes: int) -> dict:
    """The least CPU time of a digits-cnn step per batch, per pass, and each pass's distance
    from its own line through the batches (`robust_affine`, as the profile fits)."""
    torch.set_num_threads(1)
    model, loss = _cnn(), torch.nn.functional.cross_entropy
    data = {b: (torch.randn(b, 64), torch.randint(0, 10, (b,))) for b in batches}
    runs = []
    for _ in range(passes):
        least = []
        for b in batches:
            x, y = data[b]
            times = []
            for _ in range(STEP_REPS):
                t = time.thread_time()
                loss(model(x), y).backward()
                model.zero_grad(set_to_none=True)
                times.append(time.thread_time() - t)
                time.sleep(0.005)
            least.append(min(times[2:]))
        a, c, _ = robust_affine(batches, least)
        runs.append(
            {
                "least_ms": [t * 1e3 for t in least],
                "off_line": [t / (a + c * b) - 1 for b, t in zip(batches, least, strict=True)],
            }
        )
        time.sleep(2.0)
    first, last = runs[0]["least_ms"], runs[-1]["least_ms"]
    moved = [b / a - 1 for a, b in zip(first, last, strict=True)]
    return {"batches": batches, "passes": runs, "last_over_first": moved}


def print_figures(out: dict) -> None:
    print("gloo all-reduce of the digits-cnn gradient, from the last rank's arrival:")
    for r in out["allreduce"]:
        print(
            f"  {r['world']} processes, {r['gloo_threads']} gloo threads: "
            f"median {r['median_ms']:.1f} ms (p90 {r['p90_ms']:.1f}),"
            f" {r['cpu_ms_per_process']:.2f} ms CPU per process (with a barrier);"
            f" plain TCP, its 2(W-1) hops: {r['tcp_ring_chain_ms']:.2f} ms"
        )
    c = out["compute"]
    print("least CPU time of a digits-cnn step (ms) by batch, per pass; off its line (%):")
    print("  batch   " + " ".join(f"{b:>6}" for b in c["batches"]))
    for i, p in enumerate(c["passes"]):
        print(f"  pass {i}  " + " ".join(f"{t:6.2f}" for t in p["least_ms"]))
        print("  off     " + " ".join(f"{e:+6.0%}" for e in p["off_line"]))
    print("  moved   " + " ".join(f"{m:+6.0%}" for m in c["last_over_first"]))


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    worlds = _ints("--worlds", args.worlds)
    batches = sorted(set(_ints("--batches", args.batches)))
    if len(batches) < 2:
        raise ConfigError(f"--batches: two distinct batches at least, for a line (got {batches})")
    if args.passes < 1:
        raise ConfigError(f"--passes: must be >= 1 (got {args.passes})")
    threads = _ints("--gloo-threads", args.gloo_threads)
    numel = sum(p.numel() for p in _cnn().parameters())
    runs = [(w, t) for w in worlds for t in threads]
    out = {
        # a free port per run: a world size given twice (rounds) does not wait on the last
        # one's, nor a run on another job's rendezvous on this host
        "allreduce": [allreduce(w, numel, free_port(), t) for w, t in runs],
        "compute": compute(batches, args.passes),
    }
    print_figures(out)
    write_json(args.json_path, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
