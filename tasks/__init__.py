"""Prefect tasks: thin wrappers around training and infra with retries, logging, artifacts.

Installed as `hetflow.tasks`; the folder is not a package of its own.
"""

if __name__ != "hetflow.tasks":  # e.g. `import tasks` from the repository root
    raise ImportError(
        f"import hetflow.tasks, not {__name__}: only the hetflow namespace is installed"
    )
