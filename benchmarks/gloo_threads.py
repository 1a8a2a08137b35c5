"""What gloo's worker threads per process change in this host's all-reduce: 1 against 2.

    python benchmarks/gloo_threads.py 4     # or 8: the processes

N processes (fork) all-reduce the digits-cnn gradient (151,000 floats, 605 KB) 300 times after
a barrier, with `ProcessGroupGloo` options `_threads` at 2 (torch's default) and at 1, in three
alternating rounds; rank 0 prints the median and p90 of each. Figures: docs/measurements.md,
"The host's own costs".
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

GRADIENT_FLOATS = 151_000
TIMED, WARMUP = 300, 20


def rank_main(rank: int, world: int, port: int, threads: int, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    opts = dist.ProcessGroupGloo._Options()
    opts._threads = threads
    opts._devices = [dist.ProcessGroupGloo.create_default_device()]
    dist.init_process_group("gloo", rank=rank, world_size=world, pg_options=opts)
    grad = torch.ones(GRADIENT_FLOATS)
    for _ in range(WARMUP):
        dist.all_reduce(grad)
    times = []
    for _ in range(TIMED):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(grad)
        times.append(time.perf_counter() - start)
    if rank == 0:
        times.sort()
        out.put((statistics.median(times) * 1e3, times[int(0.9 * len(times))] * 1e3))
    dist.destroy_process_group()


def main(world: int) -> None:
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    port = 29611
    for _ in range(3):
        for threads in (2, 1):
            port += 1
            procs = [
                ctx.Process(target=rank_main, args=(r, world, port, threads, out))
                for r in range(world)
            ]
            for p in procs:
                p.start()
            for p in procs:
                p.join()
            median, p90 = out.get()
            print(
                f"{world} processes, {threads} gloo threads: "
                f"median {median:.2f} ms, p90 {p90:.2f} ms"
            )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4)
