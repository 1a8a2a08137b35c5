"""Checkpoints in the run's storage (local directory or S3), written so that none is half-read.

Layout under the checkpoint URL::

    ckpt-000050.pt      torch.save of the training state
    dcp-000050/         under fsdp: every rank's shards (torch.distributed.checkpoint)
    latest.json         {"step": 50, "key": "ckpt-000050.pt", "sha256": ..., "shards": ...,
                         "previous": {...}}

The state file is written first, then `latest.json` names it with its SHA-256: a crash between
the two leaves the previous pointer in place, an S3 PUT is all-or-nothing, and a local write
goes to a temporary name and is renamed. The DCP folder is complete before the state file
(`dcp.save` returns on rank 0 once every rank's files and its metadata are written), so a
pointer never names a half-written one; its bytes are not checksummed. A checkpoint whose
bytes do not match is skipped for the one before it. Only the last two are kept.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from pathlib import Path

import torch

from hetflow.infra.s3 import filesystem

POINTER = "latest.json"


class CheckpointStore:
    def __init__(self, url: str) -> None:
        if "://" not in url:
            url = Path(url).resolve().as_uri()
        self.url = url.rstrip("/")
        self.fs, self.root = filesystem(self.url)
        self.local = self.url.startswith("file://")
        if self.local:
            Path(self.root).mkdir(parents=True, exist_ok=True)

    def _put(self, name: str, data: bytes) -> None:
        path = f"{self.root}/{name}"
        if not self.local:
            self.fs.pipe_file(path, data)
            return
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def shards_name(self, step: int) -> str:
        """The DCP folder's name, relative to the store, for the checkpoint of `step`."""
        return f"dcp-{step:06d}"

    def at(self, name: str) -> str:
        """Where `name` (a folder in the store) lives: a local path, or a URL."""
        return f"{self.root}/{name}" if self.local else f"{self.url}/{name}"

    def save(self, step: int, state: dict, shards: str | None = None) -> None:
        """`state` saved as the checkpoint of `step`, which names the DCP folder `shards`
        (already written) where it has one; the one before the previous is removed."""
        buf = io.BytesIO()
        torch.save(state, buf)
        data = buf.getvalue()
        key = f"ckpt-{step:06d}.pt"
        self._put(key, data)
        old = self._pointer()
        pointer = {
            "step": step,
            "key": key,
            "sha256": hashlib.sha256(data).hexdigest(),
            "shards": shards,
            "previous": {k: old.get(k) for k in ("step", "key", "sha256", "shards")}
            if old
            else None,
        }
        self._put(POINTER, json.dumps(pointer).encode())
        stale = old.get("previous") if old else None
        if stale and stale["key"] != key:
            self.fs.rm_file(f"{self.root}/{stale['key']}")
        if stale and stale.get("shards") and stale["shards"] != shards:
            self.fs.rm(f"{self.root}/{stale['shards']}", recursive=True)

    def _pointer(self) -> dict | None:
        try:
            return json.loads(self.fs.cat_file(f"{self.root}/{POINTER}"))
        except FileNotFoundError:
            return None

    def load(self) -> dict | None:
        """The newest checkpoint whose bytes match its checksum, or None."""
        pointer = self._pointer()
        candidates = [pointer, pointer.get("previous")] if pointer else []
        for c in candidates:
            if not c:
                continue
            try:
                data = self.fs.cat_file(f"{self.root}/{c['key']}")
            except FileNotFoundError:
                continue
            if hashlib.sha256(data).hexdigest() == c["sha256"]:
                # on the CPU: the saving rank's device may not exist here; load_state_dict moves
                # each tensor onto the model's and optimizer's own device
                return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
        return None
