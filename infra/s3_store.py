"""The local S3 store: what one command wrote to the embedded endpoint is there for the next.

With no S3 configured (no `AWS_ENDPOINT_URL`, no AWS credentials with a bucket of the user's
own), each command serves S3 from moto on 127.0.0.1 for itself (`infra.s3.local_s3_endpoint`).
Its objects are kept in a folder, one plain file per object:

    $HETFLOW_HOME/s3/BUCKET/KEY          (~/.hetflow/s3/my-bucket/corpus/manifest.json)

When the endpoint starts, the folder is loaded into it (`load`); when it stops, what the
command changed is written back (`save`): objects it put or replaced are written (each to a
temporary file, then renamed), objects it deleted are deleted, and nothing else is touched. Two
commands that run at once therefore each keep their own writes; where both wrote the same key,
the one that ended last wins. Loading and saving take turns under a host lock. A command killed
with SIGKILL keeps nothing it wrote; one stopped by Ctrl-C or an error saves what it wrote.
`hetflow data ls` lists the datasets in the folder without starting any endpoint.

Why a folder and not moto's own persistence. moto keeps its state in memory; the one feature
it has to carry state across processes is its recorder (used by `hetflow stack`, whose S3
endpoint is one long-lived process), which appends every request, reads included, to one
log, from every server thread, and replays the whole log through HTTP when a process starts.
A per-command endpoint would replay and rewrite that log on every command, and two commands at
once would append to it together and then each compact it, losing the other's writes. Plain
files keep the objects readable with `ls`, listable without a server, and let each command
write back only its own changes. The cost: each command loads every object in the store into
its endpoint (moto holds objects over 5 MB in temporary files); for data too large for that,
use `hetflow stack up` or a bucket of your own.

Keys that are no file path (`a//b`, `../x`, a trailing `/`, a key that is also a prefix of
another) are served while the command runs and not kept; the command says which.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from hetflow.infra.paths import home, host_lock

# The local endpoint's credentials (moto accepts any): the store's client and `infra.s3`'s
# endpoint use them, and so does `hetflow stack`'s S3.
LOCAL_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "hetflow-local",
    "AWS_SECRET_ACCESS_KEY": "hetflow-local-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}

PARTIAL = ".hetflow-partial-"  # a temporary file being written; never loaded as an object


def store_dir() -> Path:
    """`$HETFLOW_HOME/s3`: one folder per bucket, one file per object."""
    return home() / "s3"


def object_path(root: Path, bucket: str, key: str) -> Path | None:
    """The file of `s3://bucket/key` under `root`, or None for a key that is no relative path.

    >>> object_path(Path("/s"), "b", "corpus/manifest.json")
    PosixPath('/s/b/corpus/manifest.json')
    >>> [object_path(Path("/s"), "b", k) for k in ("a//b", "../x", "d/", "./a", "")]
    [None, None, None, None, None]
    """
    parts = key.split("/")
    if (
        not key
        or not _bucket_ok(bucket)
        or any(p in ("", ".", "..") or PARTIAL in p for p in parts)
    ):
        return None
    return root.joinpath(bucket, *parts)


def local_url(url: str) -> str | None:
    """The `file://` URL in the store of `s3://BUCKET[/KEY]` (the store itself for `s3://`),
    or None for a bucket or key the store cannot hold.

    >>> local_url("s3://b/corpus/").endswith("/s3/b/corpus"), local_url("s3://b/a//c")
    (True, None)
    """
    bucket, _, key = url.removeprefix("s3://").strip("/").partition("/")
    root = store_dir()
    if not bucket:
        return root.as_uri()
    if not key:
        return (root / bucket).as_uri() if _bucket_ok(bucket) else None
    path = object_path(root, bucket, key)
    return path.as_uri() if path is not None else None


def _bucket_ok(bucket: str) -> bool:
    return bool(bucket) and "/" not in bucket and bucket not in (".", "..")


@dataclass
class Snapshot:
    """What the store held when it was loaded: each object's ETag as the endpoint gives it, and
    its file's (size, mtime_ns), so that a delete removes only the file this command saw."""

    etags: dict[tuple[str, str], str] = field(default_factory=dict)
    files: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    buckets: set[str] = field(default_factory=set)


def _client(endpoint: str):
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=LOCAL_CREDENTIALS["AWS_DEFAULT_REGION"],
        config=Config(retries={"max_attempts": 3, "mode": "standard"}),
    )


def _listing(s3) -> tuple[set[str], dict[tuple[str, str], str]]:
    buckets = {b["Name"] for b in s3.list_buckets().get("Buckets", [])}
    etags = {}
    for bucket in buckets:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for obj in page.get("Contents", []):
                etags[(bucket, obj["Key"])] = obj["ETag"]
    return buckets, etags


def _lock(root: Path):
    return host_lock(f"s3-store:{root}")


def load(endpoint: str, root: Path | None = None) -> Snapshot:
    """Put every bucket and object of the folder `root` (`store_dir()`) into the S3 at
    `endpoint`; the snapshot that `save` compares with."""
    from botocore.exceptions import ClientError, ParamValidationError

    root = root or store_dir()
    s3 = _client(endpoint)
    snap = Snapshot()
    with _lock(root):
        for bucket_dir in sorted(root.iterdir()) if root.is_dir() else []:
            if not bucket_dir.is_dir():
                continue
            bucket = bucket_dir.name
            try:
                s3.create_bucket(Bucket=bucket)
            except (ClientError, ParamValidationError) as e:
                code = e.response.get("Error", {}).get("Code") if isinstance(e, ClientError) else ""
                if code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    # a folder put there by hand, whose name is no bucket name
                    print(f"S3: {bucket_dir} not loaded: not a bucket name", file=sys.stderr)
                    continue
            for path in sorted(bucket_dir.rglob("*")):
                if not path.is_file() or PARTIAL in path.name:
                    continue
                key = path.relative_to(bucket_dir).as_posix()
                stat = path.stat()
                with open(path, "rb") as f:
                    s3.put_object(Bucket=bucket, Key=key, Body=f)
                snap.files[(bucket, key)] = (stat.st_size, stat.st_mtime_ns)
        snap.buckets, snap.etags = _listing(s3)
    return snap


@dataclass
class Saved:
    written: int = 0
    deleted: int = 0
    skipped: list[str] = field(default_factory=list)


def save(endpoint: str, snap: Snapshot, root: Path | None = None) -> Saved:
    """Write back to `root` what changed at `endpoint` since `snap`: new or replaced objects
    written, deleted ones deleted (where the file is still the one loaded), buckets made or
    removed (a removed bucket's folder only once it is empty)."""
    root = root or store_dir()
    s3 = _client(endpoint)
    done = Saved()
    with _lock(root):
        buckets, etags = _listing(s3)
        for (bucket, key), etag in sorted(etags.items()):
            if snap.etags.get((bucket, key)) == etag:
                continue
            path = object_path(root, bucket, key)
            if path is None:
                done.skipped.append(f"s3://{bucket}/{key}")
                continue
            tmp = path.with_name(f"{path.name}{PARTIAL}{os.getpid()}")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                body = s3.get_object(Bucket=bucket, Key=key)["Body"]
                with open(tmp, "wb") as f:
                    shutil.copyfileobj(body, f, 1 << 20)
                os.replace(tmp, path)
                done.written += 1
            except OSError:  # a key that is also another key's prefix ("a" and "a/b")
                tmp.unlink(missing_ok=True)
                done.skipped.append(f"s3://{bucket}/{key}")
        for bucket, key in sorted(set(snap.etags) - set(etags)):
            path = object_path(root, bucket, key)
            if path is None or not path.is_file():
                continue
            stat = path.stat()
            if snap.files.get((bucket, key)) not in (None, (stat.st_size, stat.st_mtime_ns)):
                continue  # another command wrote it since this one loaded it
            path.unlink()
            done.deleted += 1
            _prune(path.parent, root / bucket)
        for bucket in buckets - snap.buckets:
            if _bucket_ok(bucket):
                (root / bucket).mkdir(parents=True, exist_ok=True)
        for bucket in snap.buckets - buckets:
            _prune(root / bucket, root)
    return done


def _prune(folder: Path, stop: Path) -> None:
    """Remove `folder` and its parents up to (not including) `stop` while they are empty."""
    while folder != stop and stop in folder.parents:
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent


def report(done: Saved, root: Path) -> None:
    """One line on stdout for what was kept, one on stderr for what could not be."""
    if done.written or done.deleted:
        print(f"S3: kept in {root}: {done.written} objects written, {done.deleted} deleted")
    if done.skipped:
        shown = ", ".join(done.skipped[:3]) + (" ..." if len(done.skipped) > 3 else "")
        print(
            f"S3: {len(done.skipped)} objects not kept in {root} (their keys are no file "
            f"paths): {shown}",
            file=sys.stderr,
        )
