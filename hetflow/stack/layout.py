"""Where the local stack keeps its state, which ports its services use, what a client exports."""

from __future__ import annotations

import json
import os
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


def log_path(svc: Service) -> Path:
    return stack_dir() / "logs" / f"{svc.name}.log"


def pid_file(svc: Service) -> Path:
    return stack_dir() / f"{svc.name}.pid"


def recording_path() -> Path:
    return stack_dir() / "s3" / "recording.jsonl"


def saved_ports() -> dict[str, int]:
    try:
        return {
            k: int(v)
            for k, v in json.loads((stack_dir() / "stack.json").read_text())["ports"].items()
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def chosen_port(svc: Service, saved: dict[str, int]) -> int:
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


def url_of(svc: Service, port: int) -> str:
    return f"http://{HOST}:{port}"


def exports(ports: dict[str, int]) -> dict[str, str]:
    """The variables a client needs to use the stack (fake credentials of the local endpoint,
    the stack's HETFLOW_HOME)."""
    return {
        "HETFLOW_HOME": str(home()),  # a worker started from a new shell reads the same home
        "PREFECT_API_URL": f"{url_of(PREFECT, ports['prefect'])}/api",
        "MLFLOW_TRACKING_URI": url_of(MLFLOW, ports["mlflow"]),
        "AWS_ENDPOINT_URL": url_of(S3, ports["s3"]),
        **LOCAL_CREDENTIALS,
    }
