"""Micro-batches under sharded data parallelism (`train.accumulate: auto` with
`train.strategy: fsdp`): ranks whose shares split into different counts of micro-batches (1, 3,
2, and a rank with no samples) make the same collectives in every step and train the weights
and momentum of one process on the global batch; the planner splits a capped worker's share
under fsdp as under DDP."""

from __future__ import annotations

from hetflow.config import ClusterSpec, TrainConfig, check_job
from hetflow.training.plan.planner import make_plan

from tests.profiles import profile_of, rank_profile


def test_the_plan_under_fsdp_splits_a_capped_share_as_under_ddp():
    # w3 is 4x as fast and holds 16 samples at once: with accumulate 'auto' fsdp is accepted
    # before launch and its plan gives w3 several micro-batches, the same plan as DDP's
    profile = profile_of(
        [rank_profile(r, s, fit_latency_s=1e-3) for r, s in enumerate([250.0, 250.0, 500.0, 1e3])]
    )
    cluster = ClusterSpec.from_speeds([1, 1, 2, 4])
    cluster.workers[3].memory_cap_batch = 16
    kw = {"global_batch": 128, "schedule": "proportional", "accumulate": "auto"}
    fsdp, ddp = TrainConfig(strategy="fsdp", **kw), TrainConfig(**kw)
    check_job(cluster, fsdp)
    plan = make_plan(profile, cluster, fsdp)
    assert plan.micro_count[3] > 1 and plan.micro_batch[3] <= 16
    assert sum(plan.local_batches) == 128 and plan.micro_count[:3] == [1, 1, 1]
    assert plan.local_batches == make_plan(profile, cluster, ddp).local_batches
