"""Prefect flows composing the tasks, and the `hetflow` command line."""
