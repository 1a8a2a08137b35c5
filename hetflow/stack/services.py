"""Starting the stack's services: the S3 endpoint (its recording compacted), Prefect, MLflow."""

from __future__ import annotations

import base64
import json
import os
import shlex
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from hetflow.infra.s3 import LOCAL_CREDENTIALS
from hetflow.infra.tracking.links import home_url
from hetflow.stack.layout import (
    HOST,
    MLFLOW,
    MLFLOW_ARTIFACTS,
    PREFECT,
    S3,
    WORK_POOL,
    StackError,
    exports,
    log_path,
    recording_path,
    stack_dir,
    url_of,
)
from hetflow.stack.processes import http_get, spawn, wait_healthy


def base_env() -> dict[str, str]:
    env = dict(os.environ)
    # A client configuration in the caller's shell (e.g. an older env.sh) must not leak in.
    for k in (
        "PREFECT_API_URL",
        "PREFECT_API_KEY",
        "MLFLOW_TRACKING_URI",
        "AWS_PROFILE",
        "AWS_SESSION_TOKEN",
        "MOTO_ENABLE_RECORDING",
    ):
        env.pop(k, None)
    env.update(
        LOCAL_CREDENTIALS,
        DO_NOT_TRACK="true",
        MLFLOW_DISABLE_TELEMETRY="true",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PYTHONUNBUFFERED="1",
    )
    return env


def start_s3(port: int, timeout: float) -> subprocess.Popen:
    rec = recording_path()
    rec.parent.mkdir(parents=True, exist_ok=True)
    rec.touch()
    env = base_env()
    env["MOTO_RECORDER_FILEPATH"] = str(rec)  # recording starts after the replay, below
    proc = spawn(S3, [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)], env)
    wait_healthy({S3: (proc, port)}, timeout)
    api = f"{url_of(S3, port)}/moto-api/recorder"
    try:
        if rec.stat().st_size:
            http_get(f"{api}/replay-recording", timeout=max(timeout, 600), method="POST", data=b"")
        http_get(f"{api}/start-recording", method="POST", data=b"")
    except (OSError, urllib.error.URLError) as e:
        raise StackError(
            f"s3: could not restore its state from {rec} ({e}); see {log_path(S3)}"
        ) from None
    return proc


def s3_client(port: int):
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=url_of(S3, port),
        aws_access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=LOCAL_CREDENTIALS["AWS_DEFAULT_REGION"],
    )


def ensure_bucket(port: int, bucket: str) -> None:
    from botocore.exceptions import ClientError

    s3 = s3_client(port)
    try:
        s3.head_bucket(Bucket=bucket)
    except ClientError:
        s3.create_bucket(Bucket=bucket)


def compact_s3(port: int) -> int:
    """Rewrite the recording as one PUT per bucket and per object that exists now.

    Written to a temporary file and renamed over the recording, so a failure keeps the old one.
    Returns the number of objects kept.
    """
    api = f"{url_of(S3, port)}/moto-api/recorder"
    http_get(f"{api}/stop-recording", method="POST", data=b"")
    s3 = s3_client(port)
    auth = (  # moto routes a request to S3 by the signing scope; it does not check signatures
        f"AWS4-HMAC-SHA256 Credential={LOCAL_CREDENTIALS['AWS_ACCESS_KEY_ID']}/20240101/"
        f"{LOCAL_CREDENTIALS['AWS_DEFAULT_REGION']}/s3/aws4_request, "
        "SignedHeaders=host, Signature=0"
    )
    rec = recording_path()
    tmp = rec.with_suffix(".compact.tmp")
    kept = 0
    try:
        with open(tmp, "w") as out:

            def put(path: str, body: bytes, headers: dict[str, str]) -> None:
                entry = {
                    "method": "PUT",
                    "url": f"http://{HOST}/{urllib.parse.quote(path, safe='/-_.~')}",
                    "headers": {"Authorization": auth, **headers},
                    "body": base64.b64encode(body).decode("ascii"),
                    "body_encoded": True,
                }
                out.write(json.dumps(entry) + "\n")

            for bucket in s3.list_buckets().get("Buckets", []):
                name = bucket["Name"]
                put(name, b"", {})
                for page in s3.get_paginator("list_objects_v2").paginate(Bucket=name):
                    for obj in page.get("Contents", []):
                        got = s3.get_object(Bucket=name, Key=obj["Key"])
                        headers = {"Content-Type": got.get("ContentType") or "binary/octet-stream"}
                        headers.update(
                            {f"x-amz-meta-{k}": v for k, v in got.get("Metadata", {}).items()}
                        )
                        put(f"{name}/{obj['Key']}", got["Body"].read(), headers)
                        kept += 1
        os.replace(tmp, rec)
    finally:
        tmp.unlink(missing_ok=True)
    return kept


def start_prefect(port: int) -> subprocess.Popen:
    d = stack_dir() / "prefect"
    d.mkdir(parents=True, exist_ok=True)
    env = base_env()
    env.update(
        PREFECT_HOME=str(d),
        PREFECT_API_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{d / 'prefect.db'}",
        PREFECT_API_URL=f"{url_of(PREFECT, port)}/api",
        PREFECT_SERVER_API_HOST=HOST,
        PREFECT_SERVER_API_PORT=str(port),
    )
    cmd = [
        sys.executable,
        "-m",
        "prefect",
        "server",
        "start",
        "--host",
        HOST,
        "--port",
        str(port),
        "--analytics-off",
        "--no-background",
    ]
    return spawn(PREFECT, cmd, env)


def start_mlflow(port: int, s3_port: int) -> subprocess.Popen:
    d = stack_dir() / "mlflow"
    d.mkdir(parents=True, exist_ok=True)
    env = base_env()
    env.update(
        AWS_ENDPOINT_URL=url_of(S3, s3_port),
        MLFLOW_S3_ENDPOINT_URL=url_of(S3, s3_port),
        # The job runner (GenAI scoring, trace archival) starts a dozen processes; not needed here.
        MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false",
    )
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--host",
        HOST,
        "--port",
        str(port),
        "--workers",
        "1",
        "--backend-store-uri",
        f"sqlite:///{d / 'mlflow.db'}",
        "--artifacts-destination",
        MLFLOW_ARTIFACTS,
    ]
    return spawn(MLFLOW, cmd, env)


def ensure_work_pool(port: int) -> None:
    """Create the process work pool that prefect.yaml deploys to, unless it exists."""
    api = f"{url_of(PREFECT, port)}/api"
    try:
        http_get(f"{api}/work_pools/{WORK_POOL}")
        return
    except urllib.error.HTTPError as e:
        if e.code != 404:
            raise StackError(
                f"prefect: reading work pool {WORK_POOL!r} failed (HTTP {e.code})"
            ) from None
    env = base_env()
    env["PREFECT_API_URL"] = api
    done = subprocess.run(
        [sys.executable, "-m", "prefect", "work-pool", "create", WORK_POOL, "--type", "process"],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise StackError(f"prefect: could not create work pool {WORK_POOL!r}: {last[0]}")


def _save_ports(ports: dict[str, int]) -> None:
    (stack_dir() / "stack.json").write_text(json.dumps({"ports": ports}, indent=1) + "\n")


def _write_env(ports: dict[str, int]) -> tuple[list[str], Path]:
    lines = [f"export {k}={shlex.quote(v)}" for k, v in exports(ports).items()]
    _save_ports(ports)
    env_sh = stack_dir() / "env.sh"
    env_sh.write_text("# hetflow local stack: . " + str(env_sh) + "\n" + "\n".join(lines) + "\n")
    return lines, env_sh


def _print_exports(ports: dict[str, int]) -> None:
    """Shell on stdout (comments and exports: `eval "$(hetflow stack up)"` works)."""
    lines, env_sh = _write_env(ports)
    print(f"# use the stack from this shell (also in {env_sh}):")
    for line in lines:
        print(line)
    print(
        f"# Prefect UI: {url_of(PREFECT, ports['prefect'])}   "
        f"MLflow UI: {home_url(url_of(MLFLOW, ports['mlflow']))}"
    )
