"""The training loop each rank runs (`training_loop`): its state (`state`), one step
(`step`), who computes (`computing`), shared step times, checkpoints, progress, trials."""
