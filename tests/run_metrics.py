"""The run-level metric names every training run records in MLflow, and those that are shares
(checked to lie in [0, 1]); shared by the end-to-end tests of the demo and the deployed flows."""

RUN_METRICS = [
    "throughput_samples_per_s",
    "train_loop_s",
    "final_accuracy",
    "comm_bytes_total",
    "comm_bytes_per_step",
    "data_wait_fraction",
    "s3_bytes_read",
    "cache_hit_ratio",
    "straggler_idle_fraction",
    "tracking_overhead_fraction",
]
FRACTIONS = [
    "data_wait_fraction",
    "cache_hit_ratio",
    "straggler_idle_fraction",
    "final_accuracy",
    "tracking_overhead_fraction",
]
