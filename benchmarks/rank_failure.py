"""How fast a raising rank ends the job: seconds from its failure record to `run_workers`
raising `RankFailed` with every process gone (4 emulated ranks, rank 3 raises at step 5).

    python -m benchmarks.rank_failure

Figures: docs/measurements/faults.md, "A rank that raises".
"""

from __future__ import annotations

import time

from hetflow.config import ClusterSpec, TrainConfig
from hetflow.infra.workspace import digits_workspace
from hetflow.records import Plan
from hetflow.training.launch.outcome import RankFailed
from hetflow.training.launch.run import run_workers
from hetflow.training.launch.spec import Injection, RunSpec


def main(repeat: int = 3) -> None:
    with digits_workspace("rank-failure") as (tmp, dataset):
        for i in range(repeat):
            spec = RunSpec(
                run_name=f"r{i}",
                variant="raise",
                cluster=ClusterSpec.from_speeds([1, 1, 2, 4]),
                dataset=dataset,
                train=TrainConfig(recipe="digits-mlp", global_batch=64, steps=20),
                plan=Plan.equal([16] * 4),
                inject=[Injection(rank=3, step=5, kind="raise")],
                run_dir=f"{tmp}/r{i}",
            )
            t = time.time()
            try:
                run_workers(spec)
            except RankFailed as e:
                ended = time.time()
                print(
                    f"record -> job ended: {ended - e.failure.time:.2f} s "
                    f"(launch to end {ended - t:.1f} s)"
                )


if __name__ == "__main__":
    main()
