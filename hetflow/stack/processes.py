"""The stack's service processes: pid files, liveness, health checks, start and stop."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from hetflow.stack.layout import HOST, Service, StackError, log_path, pid_file, stack_dir, url_of


def read_pid(svc: Service) -> int | None:
    try:
        return int(pid_file(svc).read_text().strip())
    except (OSError, ValueError):
        return None


def alive(pid: int, marker: str | None = None) -> bool:
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
            return marker in proc.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace"
            )
    except (OSError, IndexError):
        pass  # no /proc (macOS): trust kill(pid, 0)
    return True


def running_pid(svc: Service) -> int | None:
    pid = read_pid(svc)
    if pid is not None and alive(pid, svc.marker):
        return pid
    return None


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((HOST, port)) == 0


def http_get(
    url: str, timeout: float = 2.0, method: str = "GET", data: bytes | None = None
) -> bytes:
    req = urllib.request.Request(url, method=method, data=data)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read()


def healthy(svc: Service, port: int) -> bool:
    try:
        http_get(url_of(svc, port) + svc.health_path)
        return True
    except (OSError, urllib.error.URLError, ValueError):
        return False


def spawn(svc: Service, cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    log = log_path(svc)
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
    pid_file(svc).write_text(f"{proc.pid}\n")
    return proc


def wait_healthy(procs: dict[Service, tuple[subprocess.Popen, int]], timeout: float) -> None:
    """Poll every service until it answers; raise naming the first one that died or timed out."""
    deadline = time.monotonic() + timeout
    pending = dict(procs)
    while pending:
        for svc, (proc, port) in list(pending.items()):
            if healthy(svc, port):
                del pending[svc]
            elif proc.poll() is not None:
                raise StackError(
                    f"{svc.name} exited with code {proc.returncode} while starting; "
                    f"see {log_path(svc)}"
                )
        if pending and time.monotonic() > deadline:
            svc, (_, port) = next(iter(pending.items()))
            raise StackError(
                f"{svc.name} did not answer on {url_of(svc, port)}{svc.health_path} within "
                f"{timeout:.0f}s; see {log_path(svc)}"
            )
        if pending:
            time.sleep(0.2)


def stop(svc: Service, pid: int, port: int | None, grace: float = 15.0) -> None:
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
            if not alive(pid) and (port is None or not port_open(port)):
                break
            time.sleep(0.1)
        else:
            continue
        break
    try:  # children of the leader that outlived it (server worker processes)
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    pid_file(svc).unlink(missing_ok=True)
