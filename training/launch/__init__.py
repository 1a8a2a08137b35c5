"""The launch: a `RunSpec` (`spec`) started as one process per rank under torchrun
(`local`) or Ray Train (`ray_train`), with node metrics sampled beside it."""
