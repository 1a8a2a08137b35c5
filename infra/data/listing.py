"""`hetflow data ls`: the datasets (folders that hold a manifest) under a URL, one line each.

With no S3 configured, an `s3://` URL, or none, is looked up in the local store that the
embedded endpoint serves (`infra.s3_store`, `$HETFLOW_HOME/s3`), on disk, without starting any
endpoint. With `AWS_ENDPOINT_URL` set, or for AWS (a bucket of your own and credentials), the
URL is listed there; with no URL, every bucket at `AWS_ENDPOINT_URL`. `file://` and
`memory://` URLs, and local folders, are listed as they are.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from hetflow.config import ConfigError
from hetflow.infra.data.format import MANIFEST, DatasetError, Manifest, read_manifest
from hetflow.infra.s3 import filesystem, s3_target
from hetflow.infra.s3_store import local_url, store_dir

PROTOCOLS = ("s3", "file", "memory")


@dataclass
class Found:
    url: str  # as a run names it (--dataset-url)
    manifest: Manifest | None
    problem: str | None = None  # why its manifest cannot be read
    modified: dt.datetime | None = None

    def line(self) -> str:
        if self.manifest is None:
            return f"{self.url}  unreadable: {self.problem}"
        m = self.manifest
        unit = "tokens" if m.kind == "tokens" else "samples"
        splits = ", ".join(f"{name} {s.samples}" for name, s in m.splits.items())
        size = sum(sh.bytes for s in m.splits.values() for sh in s.shards) / 1e6
        shape = {
            "tokens": f"vocab {m.vocab}",
            "images": f"shape {m.shape}, {m.classes} classes",
        }.get(m.kind, f"{m.features} features, {m.classes} classes")
        when = f"  written {self.modified:%Y-%m-%d %H:%M}" if self.modified else ""
        return f"{self.url}  {m.kind} ({shape})  {unit}: {splits}  {size:.2f} MB{when}"


def where(url: str | None) -> tuple[str, str, str]:
    """(where to list, as an fsspec URL; the URL a run names that place by; a description)."""
    protocol = url.split("://", 1)[0] if url and "://" in url else ("file" if url else "s3")
    if protocol not in PROTOCOLS:
        raise ConfigError(
            f"data ls: URL: unknown protocol {protocol}:// in {url!r} "
            "(use s3://BUCKET/PREFIX, file:///FOLDER, a local folder or memory://PREFIX)"
        )
    if protocol == "file":
        url = Path(url.removeprefix("file://")).expanduser().resolve().as_uri()
        return url, url, url
    if protocol == "memory":
        return url, url, url
    target = s3_target(url)
    rel = (url or "s3://").removeprefix("s3://").strip("/")
    if target is None:  # the embedded endpoint's objects: its store, on disk
        local = local_url(f"s3://{rel}")
        if local is None:
            raise ConfigError(f"data ls: URL: s3://{rel} is no bucket or key the store holds")
        return local, f"s3://{rel}", f"the local S3 store {store_dir()}"
    shown = "AWS" if target == "aws" else f"{target} (AWS_ENDPOINT_URL)"
    return f"s3://{rel}", f"s3://{rel}", f"S3 at {shown}"


def _join(base: str, rel: str) -> str:
    if not rel:
        return base
    return base + rel if base.endswith("://") else f"{base.rstrip('/')}/{rel}"


def _modified(fs, path: str) -> dt.datetime | None:
    try:
        info = fs.info(path)
    except OSError:
        return None
    when = info.get("mtime") or info.get("LastModified")
    if isinstance(when, (int, float)):
        return dt.datetime.fromtimestamp(when)
    return when.astimezone() if isinstance(when, dt.datetime) else None


def find_datasets(url: str | None) -> tuple[str, list[Found]]:
    """(a description of where it looked, each dataset found under `url`)."""
    look, named, described = where(url)
    protocol = look.split("://", 1)[0]
    fs, root = filesystem(look)
    root = root.rstrip("/")
    try:
        if protocol == "s3" and not root:  # every bucket at the endpoint
            paths = [p for bucket in fs.ls("") for p in fs.find(bucket)]
        else:
            paths = fs.find(root) if fs.exists(root) else []
    except OSError as e:
        raise ConfigError(f"data ls: URL: cannot list {named} ({e})") from None
    found = []
    for path in sorted(p for p in paths if p.rsplit("/", 1)[-1] == MANIFEST):
        folder = path.rsplit("/", 1)[0] if "/" in path else ""
        run_url = _join(named, folder[len(root) :].strip("/"))
        try:
            manifest = read_manifest(f"{protocol}://{folder}")
            found.append(Found(run_url, manifest, modified=_modified(fs, path)))
        except DatasetError as e:
            found.append(Found(run_url, None, str(e)))
    return described, found
