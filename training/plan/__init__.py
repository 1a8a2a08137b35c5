"""The plan: each worker's share of the batch, who is left out, which compression (pure, no
torch). `planner.make_plan` is the entry; `balance` sizes batches, `rebalancer` re-plans
during a run, `fitting` fits step times, `compression` chooses a method."""
