"""Prefect flows that compose the tasks and read like scripts.

Installed as `hetflow.flows`; the folder is not a package of its own.
"""

if __name__ != "hetflow.flows":  # e.g. `import flows` from the repository root
    raise ImportError(
        f"import hetflow.flows, not {__name__}: only the hetflow namespace is installed"
    )
