"""Prefect tasks: thin wrappers adding retries, logging and artifacts around infra/training."""
