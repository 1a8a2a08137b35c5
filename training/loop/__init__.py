"""The training loop each rank runs (`training_loop`) over its components (`checkpointer`,
`stepper`, `rebalancing`, `membership`, `evaluator`): its state (`state`), one step (`step`),
who computes (`computing`), shared step times, checkpoints, progress, trials."""
