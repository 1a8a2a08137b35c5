"""PyTorch: models, the worker loop, the scheduler, comm methods, probes, the launcher.

Installed as `hetflow.training`; the folder is not a package of its own.
"""

if __name__ != "hetflow.training":  # e.g. `import training` from the repository root
    raise ImportError(
        f"import hetflow.training, not {__name__}: only the hetflow namespace is installed"
    )
