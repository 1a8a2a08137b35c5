"""The outside world: S3 through fsspec/s3fs, the EC2 catalog, the shard cache, MLflow
tracking (`hetflow.infra.tracking`).

Installed as `hetflow.infra`; the folder is not a package of its own.
"""

if __name__ != "hetflow.infra":  # e.g. `import infra` from the repository root
    raise ImportError(
        f"import hetflow.infra, not {__name__}: only the hetflow namespace is installed"
    )
