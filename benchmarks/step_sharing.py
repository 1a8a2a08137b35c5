"""What sharing step timings costs each step: no sharing, one all-gather per step, one per 10.

    torchrun --nproc-per-node 4 -m benchmarks.step_sharing

Each of 4 processes steps a fixed CPU load (40 matmuls of 256 x 256, one thread) and an
all-reduce of a 0.6 MB gradient, 30 steps per round, in 8 rounds that alternate the order of the
variants; rank 0 prints the median step time of each and the ratio against no sharing. The
sharing is `hetflow.training.loop.compute_times.SharedStepTimes`'s: an asynchronous gloo
all-gather on a group of its own, waited for one gather later. Figures:
docs/measurements/loop.md, "Step-time sharing".
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

STEPS, ROUNDS = 30, 8
VARIANTS = {"none": 0, "every step": 1, "every 10 steps": 10}


def main() -> None:
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    control = dist.new_group(backend="gloo")
    torch.set_num_threads(1)
    a, grad = torch.randn(256, 256), torch.randn(150_000)
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for rnd in range(ROUNDS):
        names = list(VARIANTS) if rnd % 2 == 0 else list(VARIANTS)[::-1]
        for name in names:
            every, pending = VARIANTS[name], []
            dist.barrier()
            t0 = time.perf_counter()
            for step in range(STEPS):
                for _ in range(40):
                    a @ a
                dist.all_reduce(grad)
                if every and step % every == every - 1:
                    mine = torch.zeros(every, dtype=torch.float64)
                    out = [torch.zeros_like(mine) for _ in range(world)]
                    pending.append(dist.all_gather(out, mine, group=control, async_op=True))
                    while len(pending) > 1:
                        pending.pop(0).wait()
            for work in pending:
                work.wait()
            dist.barrier()
            times[name].append((time.perf_counter() - t0) / STEPS)
    if dist.get_rank() == 0:
        base = statistics.median(times["none"])
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"{name:>15}: {med * 1e3:6.2f} ms/step ({med / base - 1:+.1%})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
