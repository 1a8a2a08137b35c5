"""S3 (or any fsspec URL) access, and a local S3-protocol endpoint for runs with no AWS.

Endpoints and credentials come from the standard AWS variables (`AWS_ENDPOINT_URL`,
`AWS_ACCESS_KEY_ID`, ...), which botocore, s3fs and every torchrun child read alike; nothing
here stores or logs them.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
from collections.abc import Iterator

import fsspec

from hetflow.config import DatasetSpec
from hetflow.infra import s3_store
from hetflow.infra.s3_store import LOCAL_CREDENTIALS

DEFAULT_DATASET_URL = DatasetSpec.model_fields["url"].default


_filesystems: dict[tuple, fsspec.AbstractFileSystem] = {}
_filesystems_lock = threading.Lock()


def filesystem(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem for a URL and the path inside it (s3://, file://, memory://).

    One filesystem (one S3 client) per process, protocol and AWS_* environment (endpoint,
    credentials, retry settings): a new client per read costs more than the read itself
    (docs/measurements/data.md, "S3 clients"), and a changed endpoint or credentials (tests,
    `local_s3_endpoint`, a proxy) gets a client of its own. Listings are
    not cached, so an object another writer put or removed is seen at once.

    A local filesystem makes a file's missing parent folders when the file is written
    (`auto_mkdir`), as S3 needs none: a key like `<root>/train/shard-00000.npz` writes the
    same to `file://` as to `s3://`, whether or not `<root>` exists yet.
    """
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
    protocol = url.split("://", 1)[0] if "://" in url else "file"
    key = (protocol, os.getpid(), env)
    with _filesystems_lock:
        fs = _filesystems.get(key)
        if fs is None:
            opts: dict = {"auto_mkdir": True} if protocol == "file" else {}
            if protocol == "s3":
                # botocore's own retries (exponential backoff) absorb throttling, 5xx and resets;
                # AWS_RETRY_MODE / AWS_MAX_ATTEMPTS, when set, win.
                retries = {
                    "mode": os.environ.get("AWS_RETRY_MODE", "standard"),
                    "max_attempts": int(os.environ.get("AWS_MAX_ATTEMPTS", "6")),
                }
                opts = {
                    "config_kwargs": {"retries": retries},
                    "skip_instance_cache": True,
                    "use_listings_cache": False,
                }
            fs, path = fsspec.core.url_to_fs(url, **opts)
            _filesystems[key] = fs
            return fs, path
    return fs, fs._strip_protocol(url)


def ensure_bucket(url: str) -> None:
    """Create the bucket of an s3:// URL if it does not exist (local endpoints only need it)."""
    if not url.startswith("s3://"):
        return
    fs, path = filesystem(url)
    bucket = path.split("/", 1)[0]
    if not fs.exists(bucket):
        fs.mkdir(bucket)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def local_endpoint_environ(endpoint: str) -> Iterator[None]:
    """`AWS_ENDPOINT_URL` and the local credentials in `os.environ` (children inherit them) for
    the context; what was there before is put back."""
    values = {**LOCAL_CREDENTIALS, "AWS_ENDPOINT_URL": endpoint}
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def bucket_of(dataset_url: str | None) -> str:
    """The bucket of a dataset URL (`DatasetSpec`'s default when None).

    >>> bucket_of("s3://my-bucket/data/digits"), bucket_of(None)
    ('my-bucket', 'hetflow-data')
    """
    return (dataset_url or DEFAULT_DATASET_URL).split("://", 1)[-1].split("/", 1)[0]


def profiles_root(dataset_url: str | None) -> str:
    """Where the profiles of runs on `dataset_url` live: `s3://<its bucket>/profiles` for a
    dataset in S3; for one anywhere else (a local folder, `file://`), the default bucket's,
    which `local_s3_endpoint` serves from the local store under `$HETFLOW_HOME/s3` (or the
    endpoint `AWS_ENDPOINT_URL` names): a path taken from a folder's URL would be the
    filesystem's root.

    >>> profiles_root("s3://my-bucket/data"), profiles_root("file:///tmp/mydata")
    ('s3://my-bucket/profiles', 's3://hetflow-data/profiles')
    """
    in_s3 = (dataset_url or DEFAULT_DATASET_URL).startswith("s3://")
    return f"s3://{bucket_of(dataset_url if in_s3 else None)}/profiles"


def _bucket_line(dataset_url: str | None) -> str:
    """The dataset's bucket, or where the dataset is when that is not S3 (the run's
    checkpoints are still written to S3)."""
    if (dataset_url or DEFAULT_DATASET_URL).startswith("s3://"):
        return bucket_of(dataset_url)
    return f"none: the dataset is at {dataset_url}"


def s3_target(dataset_url: str | None = None) -> str | None:
    """The S3 a run with `dataset_url` uses: `AWS_ENDPOINT_URL` when set; "aws" for a bucket of
    the user's own (any bucket but the default one) with AWS credentials in the
    environment; None for a local endpoint started for the run (`local_s3_endpoint`)."""
    if os.environ.get("AWS_ENDPOINT_URL"):
        return os.environ["AWS_ENDPOINT_URL"]
    own_url = (
        bool(dataset_url)
        and dataset_url.startswith("s3://")
        and bucket_of(dataset_url) != bucket_of(None)
    )
    if own_url and (os.environ.get("AWS_ACCESS_KEY_ID") or os.environ.get("AWS_PROFILE")):
        return "aws"
    return None


@contextlib.contextmanager
def local_s3_endpoint(dataset_url: str | None = None, keep: bool = True) -> Iterator[str]:
    """The S3 a run uses, announced in one line before anything is written.

    `AWS_ENDPOINT_URL` when it is set; real AWS only when the user named a dataset URL of their
    own (`dataset_url` other than `DatasetSpec`'s default), whose bucket is theirs, and the
    environment holds AWS credentials; otherwise an S3 endpoint served by moto on loopback for
    the context. Credentials alone never send a run to AWS: a bucket name is global there, so
    the default bucket may belong to anyone. The local endpoint and its fake credentials are put
    in `os.environ` so that child processes (torchrun ranks) reach the same endpoint; what was
    there is put back after.

    The local endpoint starts with the objects of the local store, `$HETFLOW_HOME/s3`, and what
    the context wrote is kept there when it ends (`infra.s3_store`), so that one command's
    dataset is there for the next; `keep=False` (throwaway data: benchmarks, the EC2 catalog)
    neither loads nor keeps it.
    """
    bucket = _bucket_line(dataset_url)
    target = s3_target(dataset_url)
    if target == "aws":
        print(f"S3: AWS with the environment's credentials, bucket {bucket} (the dataset's URL)")
        yield "aws"
        return
    if target is not None:
        print(f"S3: {target} (AWS_ENDPOINT_URL), bucket {bucket}")
        yield target
        return
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    try:
        if not keep:
            with local_endpoint_environ(endpoint):
                print(f"S3: a local endpoint at {endpoint} (moto, for this run), bucket {bucket}")
                yield endpoint
            return
        root = s3_store.store_dir()
        snapshot = s3_store.load(endpoint, root)
        print(
            f"S3: a local endpoint at {endpoint} (moto), bucket {bucket}, "
            f"objects kept in {root} ({len(snapshot.etags)} there)"
        )
        try:
            with local_endpoint_environ(endpoint):
                yield endpoint
        finally:
            try:
                s3_store.report(s3_store.save(endpoint, snapshot, root), root)
            except Exception as e:  # the command's own outcome stands; say what was not kept
                print(f"S3: could not keep this command's objects in {root} ({e})", file=sys.stderr)
    finally:
        server.stop()
