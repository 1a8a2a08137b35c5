"""Checkpoints in the run's storage (local directory or S3), written so that none is half-read.

Layout under the checkpoint URL::

    ckpt-000050.pt      torch.save of the training state
    latest.json         {"step": 50, "key": "ckpt-000050.pt", "sha256": ..., "previous": {...}}

The state file is written first, then `latest.json` names it with its SHA-256: a crash between
the two leaves the previous pointer in place, an S3 PUT is all-or-nothing, and a local write
goes to a temporary name and is renamed. A checkpoint whose bytes do not match is skipped for
the one before it. Only the last two are kept.
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

    def save(self, step: int, state: dict) -> None:
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
            "previous": {k: old[k] for k in ("step", "key", "sha256")} if old else None,
        }
        self._put(POINTER, json.dumps(pointer).encode())
        stale = old.get("previous") if old else None
        if stale and stale["key"] != key:
            self.fs.rm_file(f"{self.root}/{stale['key']}")

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
