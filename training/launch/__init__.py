"""The launch: a `RunSpec` (`spec`) started as one process per rank. `run` is the one
interface (`run_workers`, `run_plan`, `measure_profile`): it hands the job to torchrun
(`local`) or Ray Train (`ray_train`), which import each other not; what both hand back, and
their errors, are in `outcome`. Node metrics are sampled beside the ranks (`node_metrics`)."""
