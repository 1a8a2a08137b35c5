"""The S3 endpoint the data benchmarks read from (`benchmarks/data.py` and, inside training
runs, `benchmarks/data_train.py`): both import it from here, so that neither imports the
other for it."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

from hetflow.infra.s3 import free_port, local_endpoint_environ, local_s3_endpoint


@contextlib.contextmanager
def s3_endpoint(in_process: bool) -> Iterator[str]:
    """infra.s3.local_s3_endpoint, with moto in a process of its own unless `in_process`.

    In-process moto serves each GET on a thread of this process, so its request handling would
    compete with the measured loop for the GIL and be counted as data wait; a real S3 is remote.
    A configured endpoint (AWS_ENDPOINT_URL or credentials) is used as it is.
    """
    if in_process or os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ACCESS_KEY_ID"):
        with local_s3_endpoint(keep=False) as endpoint:
            yield endpoint
        return
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.1)
        with local_endpoint_environ(f"http://127.0.0.1:{port}"), local_s3_endpoint() as endpoint:
            yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=10)
