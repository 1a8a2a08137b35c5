"""A persistent local stack on 127.0.0.1: an S3 endpoint, a Prefect server, an MLflow server.

    hetflow stack up       start what is not running, create the `hetflow-local` process work
                           pool that prefect.yaml deploys to, and print the `export ...` lines
                           that point a shell at the stack (`eval "$(hetflow stack up)"` works:
                           progress goes to stderr)
    hetflow stack status   one line per service: up or down, pid, URL, log file
    hetflow stack down     stop the services (SIGTERM to each process group, then SIGKILL)

All state lives in one directory, `$HETFLOW_HOME/stack` (`~/.hetflow/stack` by default):

    env.sh                  the export lines that `up` prints (`. ~/.hetflow/stack/env.sh`)
    stack.json              the ports the services were started on
    <service>.pid           the pid of each service, the leader of its own process group
    logs/<service>.log      each service's output
    s3/recording.jsonl      the S3 endpoint's state (see below)
    prefect/                PREFECT_HOME of the server, with its SQLite database
    mlflow/mlflow.db        MLflow's backend store; artifacts go to s3://hetflow-mlflow/artifacts

The S3 endpoint is moto's server, which keeps its state in memory. moto's recorder appends
every request to `s3/recording.jsonl`; `up` replays that file into a fresh server before
anything else can reach it. `down` first compacts the file into one PutObject per object that
exists (so the file does not grow without bound, and objects uploaded in several parts, which
a replay of the raw requests cannot rebuild, survive too). What a compaction keeps: buckets,
objects with their content type and user metadata; not bucket settings such as versioning or
policies, and not old versions. If the endpoint dies without `down`, objects uploaded in parts
since the last `down` are lost; everything else is replayed. Between two `down`s the file holds
every request (reads too), and a replay reads it whole: fine for a local stack of a few GB.

Ports: `HETFLOW_STACK_S3_PORT`, `HETFLOW_STACK_PREFECT_PORT`, `HETFLOW_STACK_MLFLOW_PORT`,
else the ports of the last `up`, else 5555 (S3), 4200 (Prefect), 5000 (MLflow). A port in use
is an error that names the variable to set. `HETFLOW_STACK_TIMEOUT` (seconds,
default 180) bounds the wait for each service to answer. Everything binds to 127.0.0.1 only;
the only credentials printed are the fixed fake ones of the local endpoint.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from hetflow.infra.paths import home
from hetflow.infra.s3 import LOCAL_CREDENTIALS

HOST = "127.0.0.1"
MLFLOW_BUCKET = "hetflow-mlflow"
MLFLOW_ARTIFACTS = f"s3://{MLFLOW_BUCKET}/artifacts"
WORK_POOL = "hetflow-local"  # the process work pool that prefect.yaml deploys to


@dataclass(frozen=True)
class Service:
    name: str
    default_port: int
    health_path: str  # answers 2xx when the service is ready
    marker: str  # a word of its command line, to tell our process from a recycled pid

    @property
    def port_env(self) -> str:
        return f"HETFLOW_STACK_{self.name.upper()}_PORT"


S3 = Service("s3", 5555, "/moto-api/config", "moto.server")
PREFECT = Service("prefect", 4200, "/api/health", "prefect")
MLFLOW = Service("mlflow", 5000, "/health", "mlflow")
SERVICES = (S3, PREFECT, MLFLOW)


class StackError(RuntimeError):
    """A service could not be started or reached; the message is one line."""


def stack_dir() -> Path:
    d = home() / "stack"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _log(svc: Service) -> Path:
    return stack_dir() / "logs" / f"{svc.name}.log"


def _pid_file(svc: Service) -> Path:
    return stack_dir() / f"{svc.name}.pid"


def _recording() -> Path:
    return stack_dir() / "s3" / "recording.jsonl"


def _saved_ports() -> dict[str, int]:
    try:
        return {k: int(v) for k, v in json.loads((stack_dir() / "stack.json").read_text())["ports"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def _port(svc: Service, saved: dict[str, int]) -> int:
    """The port to start a service on: its environment variable, the last one used, the default."""
    raw = os.environ.get(svc.port_env)
    if raw:
        try:
            port = int(raw)
        except ValueError:
            raise StackError(f"{svc.port_env}: expected a port number (got {raw!r})") from None
        if not 1 <= port <= 65535:
            raise StackError(f"{svc.port_env}: expected a port number in 1..65535 (got {port})")
        return port
    return saved.get(svc.name, svc.default_port)


def _url(svc: Service, port: int) -> str:
    return f"http://{HOST}:{port}"


def exports(ports: dict[str, int]) -> dict[str, str]:
    """The variables a client needs to use the stack (fake credentials of the local endpoint)."""
    return {
        "PREFECT_API_URL": f"{_url(PREFECT, ports['prefect'])}/api",
        "MLFLOW_TRACKING_URI": _url(MLFLOW, ports["mlflow"]),
        "AWS_ENDPOINT_URL": _url(S3, ports["s3"]),
        **LOCAL_CREDENTIALS,
    }


# ---------------------------------------------------------------------------------------------
# processes


def _read_pid(svc: Service) -> int | None:
    try:
        return int(_pid_file(svc).read_text().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int, marker: str | None = None) -> bool:
    """Is `pid` a live process (not a zombie), and, where /proc tells, one of ours?"""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)  # reap it if it is our own child
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # someone else's process took the pid
    proc = Path(f"/proc/{pid}")
    try:
        if proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
            return False
        if marker is not None:
            return marker in proc.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, IndexError):
        pass  # no /proc (macOS): trust kill(pid, 0)
    return True


def _running(svc: Service) -> int | None:
    pid = _read_pid(svc)
    if pid is not None and _alive(pid, svc.marker):
        return pid
    return None


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((HOST, port)) == 0


def _get(url: str, timeout: float = 2.0, method: str = "GET", data: bytes | None = None) -> bytes:
    req = urllib.request.Request(url, method=method, data=data)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read()


def _healthy(svc: Service, port: int) -> bool:
    try:
        _get(_url(svc, port) + svc.health_path)
        return True
    except (OSError, urllib.error.URLError, ValueError):
        return False


def _spawn(svc: Service, cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    log = _log(svc)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(cmd)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            cmd,
            env=env,
            cwd=stack_dir(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: `down` stops it and its children
            close_fds=True,
        )
    _pid_file(svc).write_text(f"{proc.pid}\n")
    return proc


def _wait_healthy(procs: dict[Service, tuple[subprocess.Popen, int]], timeout: float) -> None:
    """Poll every service until it answers; raise naming the first one that died or timed out."""
    deadline = time.monotonic() + timeout
    pending = dict(procs)
    while pending:
        for svc, (proc, port) in list(pending.items()):
            if _healthy(svc, port):
                del pending[svc]
            elif proc.poll() is not None:
                raise StackError(
                    f"{svc.name} exited with code {proc.returncode} while starting; see {_log(svc)}"
                )
        if pending and time.monotonic() > deadline:
            svc, (_, port) = next(iter(pending.items()))
            raise StackError(
                f"{svc.name} did not answer on {_url(svc, port)}{svc.health_path} within "
                f"{timeout:.0f}s; see {_log(svc)}"
            )
        if pending:
            time.sleep(0.2)


def _stop(svc: Service, pid: int, port: int | None, grace: float = 15.0) -> None:
    """SIGTERM the service's process group, SIGKILL it after `grace` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            break
        except PermissionError:
            os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not _alive(pid) and (port is None or not _port_open(port)):
                break
            time.sleep(0.1)
        else:
            continue
        break
    try:  # children of the leader that outlived it (server worker processes)
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    _pid_file(svc).unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------
# the services


def _base_env() -> dict[str, str]:
    env = dict(os.environ)
    # A client configuration in the caller's shell (e.g. an older env.sh) must not leak in.
    for k in ("PREFECT_API_URL", "PREFECT_API_KEY", "MLFLOW_TRACKING_URI", "AWS_PROFILE",
              "AWS_SESSION_TOKEN", "MOTO_ENABLE_RECORDING"):
        env.pop(k, None)
    env.update(LOCAL_CREDENTIALS, DO_NOT_TRACK="true", MLFLOW_DISABLE_TELEMETRY="true",
               PREFECT_SERVER_ANALYTICS_ENABLED="false", PYTHONUNBUFFERED="1")
    return env


def _start_s3(port: int, timeout: float) -> subprocess.Popen:
    rec = _recording()
    rec.parent.mkdir(parents=True, exist_ok=True)
    rec.touch()
    env = _base_env()
    env["MOTO_RECORDER_FILEPATH"] = str(rec)  # recording starts after the replay, below
    proc = _spawn(S3, [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)], env)
    _wait_healthy({S3: (proc, port)}, timeout)
    api = f"{_url(S3, port)}/moto-api/recorder"
    try:
        if rec.stat().st_size:
            _get(f"{api}/replay-recording", timeout=max(timeout, 600), method="POST", data=b"")
        _get(f"{api}/start-recording", method="POST", data=b"")
    except (OSError, urllib.error.URLError) as e:
        raise StackError(f"s3: could not restore its state from {rec} ({e}); see {_log(S3)}") from None
    return proc


def _s3_client(port: int):
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=_url(S3, port),
        aws_access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=LOCAL_CREDENTIALS["AWS_DEFAULT_REGION"],
    )


def _ensure_bucket(port: int, bucket: str) -> None:
    from botocore.exceptions import ClientError

    s3 = _s3_client(port)
    try:
        s3.head_bucket(Bucket=bucket)
    except ClientError:
        s3.create_bucket(Bucket=bucket)


def _compact_s3(port: int) -> int:
    """Rewrite the recording as one PUT per bucket and per object that exists now.

    Written to a temporary file and renamed over the recording, so a failure keeps the old one.
    Returns the number of objects kept.
    """
    api = f"{_url(S3, port)}/moto-api/recorder"
    _get(f"{api}/stop-recording", method="POST", data=b"")
    s3 = _s3_client(port)
    auth = (  # moto routes a request to S3 by the signing scope; it does not check signatures
        f"AWS4-HMAC-SHA256 Credential={LOCAL_CREDENTIALS['AWS_ACCESS_KEY_ID']}/20240101/"
        f"{LOCAL_CREDENTIALS['AWS_DEFAULT_REGION']}/s3/aws4_request, SignedHeaders=host, Signature=0"
    )
    rec = _recording()
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
                        headers.update({f"x-amz-meta-{k}": v for k, v in got.get("Metadata", {}).items()})
                        put(f"{name}/{obj['Key']}", got["Body"].read(), headers)
                        kept += 1
        os.replace(tmp, rec)
    finally:
        tmp.unlink(missing_ok=True)
    return kept


def _start_prefect(port: int) -> subprocess.Popen:
    d = stack_dir() / "prefect"
    d.mkdir(parents=True, exist_ok=True)
    env = _base_env()
    env.update(
        PREFECT_HOME=str(d),
        PREFECT_API_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{d / 'prefect.db'}",
        PREFECT_API_URL=f"{_url(PREFECT, port)}/api",
        PREFECT_SERVER_API_HOST=HOST,
        PREFECT_SERVER_API_PORT=str(port),
    )
    cmd = [sys.executable, "-m", "prefect", "server", "start", "--host", HOST, "--port", str(port),
           "--analytics-off", "--no-background"]
    return _spawn(PREFECT, cmd, env)


def _start_mlflow(port: int, s3_port: int) -> subprocess.Popen:
    d = stack_dir() / "mlflow"
    d.mkdir(parents=True, exist_ok=True)
    env = _base_env()
    env.update(
        AWS_ENDPOINT_URL=_url(S3, s3_port),
        MLFLOW_S3_ENDPOINT_URL=_url(S3, s3_port),
        # The job runner (GenAI scoring, trace archival) starts a dozen processes; not needed here.
        MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false",
    )
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", HOST, "--port", str(port),
           "--workers", "1", "--backend-store-uri", f"sqlite:///{d / 'mlflow.db'}",
           "--artifacts-destination", MLFLOW_ARTIFACTS]
    return _spawn(MLFLOW, cmd, env)


def _ensure_work_pool(port: int) -> None:
    """Create the process work pool that prefect.yaml deploys to, unless it exists."""
    api = f"{_url(PREFECT, port)}/api"
    try:
        _get(f"{api}/work_pools/{WORK_POOL}")
        return
    except urllib.error.HTTPError as e:
        if e.code != 404:
            raise StackError(f"prefect: reading work pool {WORK_POOL!r} failed (HTTP {e.code})") from None
    env = _base_env()
    env["PREFECT_API_URL"] = api
    done = subprocess.run(
        [sys.executable, "-m", "prefect", "work-pool", "create", WORK_POOL, "--type", "process"],
        check=False, env=env, capture_output=True, text=True, timeout=120,
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
    print(f"# Prefect UI: {_url(PREFECT, ports['prefect'])}   MLflow UI: {_url(MLFLOW, ports['mlflow'])}")


# ---------------------------------------------------------------------------------------------
# the commands


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def up() -> int:
    """Start every service that is not running; 0 when all answer, 1 otherwise."""
    try:
        return _up()
    except StackError as e:
        print(f"hetflow stack: error: {e}", file=sys.stderr)
        return 1


def _up() -> int:
    saved = _saved_ports()
    running = {svc: pid for svc in SERVICES if (pid := _running(svc)) is not None}
    ports = {svc.name: (saved.get(svc.name) if svc in running and svc.name in saved else _port(svc, saved))
             for svc in SERVICES}
    if len(running) == len(SERVICES):
        print(f"# hetflow stack: already running ({', '.join(f'{s.name} pid {p}' for s, p in running.items())})")
        _print_exports(ports)
        return 0
    to_start = [svc for svc in SERVICES if svc not in running]
    for svc in to_start:
        if _port_open(ports[svc.name]):
            raise StackError(
                f"cannot start {svc.name}: {HOST}:{ports[svc.name]} is already in use "
                f"(set {svc.port_env} to a free port)"
            )
    try:
        timeout = float(os.environ.get("HETFLOW_STACK_TIMEOUT") or 180)
    except ValueError:
        raise StackError(f"HETFLOW_STACK_TIMEOUT: expected seconds (got {os.environ['HETFLOW_STACK_TIMEOUT']!r})") from None
    _save_ports(ports)  # from here on, `status` and `down` find the services
    started: list[tuple[Service, int]] = []
    try:
        if S3 in to_start:
            _progress(f"starting s3 on {_url(S3, ports['s3'])} ...")
            started.append((S3, _start_s3(ports["s3"], timeout).pid))
        _ensure_bucket(ports["s3"], MLFLOW_BUCKET)
        procs = {}
        if PREFECT in to_start:
            _progress(f"starting prefect on {_url(PREFECT, ports['prefect'])} ...")
            procs[PREFECT] = (_start_prefect(ports["prefect"]), ports["prefect"])
        if MLFLOW in to_start:
            _progress(f"starting mlflow on {_url(MLFLOW, ports['mlflow'])} ...")
            procs[MLFLOW] = (_start_mlflow(ports["mlflow"], ports["s3"]), ports["mlflow"])
        started += [(svc, proc.pid) for svc, (proc, _) in procs.items()]
        _wait_healthy(procs, timeout)
        _ensure_work_pool(ports["prefect"])
    except BaseException:
        for svc, pid in reversed(started):  # leave nothing half-started behind
            _stop(svc, pid, ports[svc.name], grace=5.0)
        raise
    print(f"# hetflow stack: up, state in {stack_dir()}")
    _print_exports(ports)
    return 0


def status() -> int:
    """One line per service (up, down, or no-answer: running but not answering yet);
    0 when all three are up, 1 otherwise."""
    saved = _saved_ports()
    all_up = True
    for svc in SERVICES:
        port = saved.get(svc.name) or _port(svc, saved)
        pid = _running(svc)
        state = "up" if pid is not None and _healthy(svc, port) else ("no-answer" if pid else "down")
        all_up &= state == "up"
        shown = f"pid {pid}" if pid else "-"
        print(f"{svc.name:<8} {state:<8} {shown:<11} {_url(svc, port):<24} log: {_log(svc)}")
    if all_up:
        print(f"env: . {stack_dir() / 'env.sh'}")
    return 0 if all_up else 1


def down() -> int:
    """Stop the services (MLflow and Prefect first, then S3 after compacting its state)."""
    saved = _saved_ports()
    for svc in reversed(SERVICES):
        pid = _running(svc)
        port = saved.get(svc.name)
        if pid is None:
            _pid_file(svc).unlink(missing_ok=True)
            print(f"{svc.name}: not running")
            continue
        if svc is S3 and port is not None:
            try:
                kept = _compact_s3(port)
                print(f"s3: state saved ({kept} objects) in {_recording()}")
            except Exception as e:  # noqa: BLE001 - keep the raw recording: it still replays
                print(f"s3: could not compact its state ({type(e).__name__}: {e}); "
                      f"keeping the request log {_recording()}", file=sys.stderr)
        _stop(svc, pid, port)
        print(f"{svc.name}: stopped (pid {pid})")
    return 0
