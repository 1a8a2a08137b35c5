"""Before a run starts: can the services it will use be reached? One line if not.

A run talks to up to three services: S3 (`AWS_ENDPOINT_URL`, or AWS for a bucket of the
user's own), MLflow (`TrackingConfig.tracking_uri`, else `MLFLOW_TRACKING_URI`) and the Prefect
API (`PREFECT_API_URL`). Their clients retry a dead endpoint for a minute or more (botocore's
retry mode, Prefect's client), which is right for a transient fault during a run but leaves a
user with a typo in a URL waiting, then reading a long traceback. So each is asked once,
before anything is written or launched, with a short connect timeout and no retry (here
only: the clients the run uses keep their own retries), and every dead one is named in one
line with the variable to set:

    >>> import os; os.environ.pop("PREFECT_API_URL", None) and None
    >>> prefect_problem() is None     # no PREFECT_API_URL: Prefect's ephemeral API, nothing to ask
    True
    >>> http_problem("http://127.0.0.1:9/health")   # nothing listens on port 9 (discard)
    'connection refused'

Embedded services (the local S3 endpoint a run starts, an MLflow SQLite file, Prefect's
ephemeral API) are not asked: the run starts them itself.
"""

from __future__ import annotations

import os
import socket
import tempfile
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from hetflow.config import ConfigError, TrackingConfig

__all__ = [
    "Reached",
    "ServiceUnreachable",
    "check_services",
    "http_problem",
    "mlflow_problem",
    "prefect_problem",
    "s3_problem",
]

TIMEOUT_S = 3.0  # to connect, and to answer, per service: three dead ones stay inside 20 s


class ServiceUnreachable(ConfigError):
    """A service a run needs did not answer; the message (one line) names each and what to set."""


def _reason(e: BaseException) -> str:
    """A short why: 'connection refused', 'no answer in 3 s', 'name not resolved', ..."""
    while True:  # the cause under urllib's and botocore's wrappers
        inner = getattr(e, "reason", None) or getattr(e, "kwargs", {}).get("error")
        if not isinstance(inner, BaseException):
            break
        e = inner
    text = str(e).lower()
    if isinstance(e, TimeoutError) or "timed out" in text or "timeout" in text:
        return f"no answer in {TIMEOUT_S:g} s"
    if isinstance(e, ConnectionRefusedError) or "refused" in text:
        return "connection refused"
    if isinstance(e, socket.gaierror) or "name or service" in text:
        return "host name not resolved"
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return text[:120]


def http_problem(url: str) -> str | None:
    """Why `url` cannot be reached (refused, timed out, unresolved); None once any HTTP answer
    comes back (an error status too: something answers there)."""
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S):
            return None
    except urllib.error.HTTPError:
        return None
    except (OSError, ValueError) as e:
        return _reason(e)


def s3_problem(endpoint: str | None, bucket: str) -> str | None:
    """Why S3 at `endpoint` (None: AWS) cannot be reached; None when it answers, whatever it
    says of `bucket` (missing or forbidden is the run's business, not reachability). The
    request is unsigned: it asks whether the endpoint answers, and carries no credential."""
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    config = Config(
        signature_version=UNSIGNED,
        connect_timeout=TIMEOUT_S,
        read_timeout=TIMEOUT_S,
        retries={"mode": "standard", "max_attempts": 1},
    )
    try:
        boto3.client("s3", endpoint_url=endpoint, config=config).head_bucket(Bucket=bucket)
    except ClientError:
        return None
    except (BotoCoreError, OSError, ValueError) as e:
        return _reason(e)
    return None


def has_credentials() -> bool:
    """Whether botocore finds AWS credentials (environment, profile, instance role)."""
    import boto3

    return boto3.Session().get_credentials() is not None


def prefect_problem() -> str | None:
    """The line for a `PREFECT_API_URL` that does not answer; None when unset or answering."""
    api = os.environ.get("PREFECT_API_URL", "").rstrip("/")
    if not api:
        return None
    why = http_problem(f"{api}/health")
    if why is None:
        return None
    return (
        f"Prefect API {api} (PREFECT_API_URL) cannot be reached: {why}; start it "
        "(`hetflow stack up`), or unset PREFECT_API_URL to run on Prefect's ephemeral API"
    )


def mlflow_problem(tracking: TrackingConfig) -> str | None:
    """The line for an MLflow server that does not answer; None for a store that is a file
    (SQLite, a folder) or a server that answers."""
    uri = tracking.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or ""
    if not uri.startswith(("http://", "https://")):
        return None
    source = "tracking.tracking_uri" if tracking.tracking_uri else "MLFLOW_TRACKING_URI"
    why = http_problem(f"{uri.rstrip('/')}/health")
    if why is None:
        return None
    return (
        f"MLflow {uri} ({source}) cannot be reached: {why}; start the server, or set {source} "
        "to one that answers (unset, runs are recorded in a SQLite file under HETFLOW_HOME)"
    )


def s3_problem_line(dataset_url: str | None) -> str | None:
    """The line for the S3 a run with `dataset_url` would use (`s3_target`), if it is dead."""
    from hetflow.infra.s3 import bucket_of, s3_target

    target = s3_target(dataset_url)
    if target is None or not dataset_url.startswith("s3://"):
        return None  # the run's own local endpoint, or data that is not in S3
    endpoint = None if target == "aws" else target
    why = s3_problem(endpoint, bucket_of(dataset_url))
    if why is None:
        if has_credentials():
            return None
        # s3fs would fail to sign every request, and retry for a minute
        return (
            f"S3 endpoint {endpoint} (AWS_ENDPOINT_URL) answers, but the environment holds no "
            "AWS credentials for it; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
        )
    if endpoint is None:
        return (
            f"S3 (AWS, bucket {bucket_of(dataset_url)}) cannot be reached: {why}; check the "
            "network and credentials, or set AWS_ENDPOINT_URL to an S3 endpoint that answers"
        )
    return (
        f"S3 endpoint {endpoint} (AWS_ENDPOINT_URL) cannot be reached: {why}; start it, or "
        "set AWS_ENDPOINT_URL to one that answers (unset, a run starts a local endpoint)"
    )


def ray_problem(address: str) -> str | None:
    """None when the Ray cluster at `address` ('auto': the one `ray start` left on this
    machine; HOST:PORT; ray://HOST:PORT) accepts a connection; else what is wrong, in words."""
    if address == "auto":
        try:
            address = (Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster").read_text()
        except OSError:
            return (
                "no Ray cluster runs on this machine (cluster.ray_address 'auto'): start one "
                "with `ray start --head`, or set RAY_ADDRESS or --ray-address"
            )
    host, _, port = address.strip().removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=TIMEOUT_S):
            return None
    except (OSError, ValueError) as e:
        return (
            f"no Ray cluster answers at {address.strip()} (cluster.ray_address): {_reason(e)}; "
            "set it, or RAY_ADDRESS, to a running cluster's address (`ray start --head`)"
        )


@dataclass(frozen=True)
class Reached:
    """The services that answered a `check_services` call, as (service, where) pairs: what a
    command hands its flow (the flows' `reached` parameter), so that the flow's own check
    asks none of them again. Nothing else keeps an answer."""

    answered: frozenset[tuple[str, str]] = frozenset()


def check_services(
    dataset_url: str | None = None,
    tracking: TrackingConfig | None = None,
    prefect: bool = False,
    ray_address: str | None = None,
    reached: Reached | None = None,
) -> Reached:
    """Raise ServiceUnreachable (one line, every dead service named) unless S3 for
    `dataset_url` (when given), MLflow for `tracking` (when given), the Ray cluster at
    `ray_address` (when given) and, with `prefect`, the Prefect API answer. All are asked at
    once, each within a few seconds; nothing is written. A service in `reached` (what an
    earlier call returned: a command's, passed to its flow) is not asked again; every other
    one is asked on every call. Returns what answered, `reached`'s included."""
    asks: dict[tuple[str, str], object] = {}
    if prefect:
        asks[("prefect", os.environ.get("PREFECT_API_URL", ""))] = prefect_problem
    if ray_address is not None:
        asks[("ray", ray_address)] = lambda: ray_problem(ray_address)
    if dataset_url is not None:
        where = f"{os.environ.get('AWS_ENDPOINT_URL', '')} {dataset_url}"
        asks[("s3", where)] = lambda: s3_problem_line(dataset_url)
    if tracking is not None:
        uri = tracking.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", "")
        asks[("mlflow", uri)] = lambda: mlflow_problem(tracking)
    known = reached.answered if reached is not None else frozenset()
    asks = {k: ask for k, ask in asks.items() if k not in known}
    with ThreadPoolExecutor(max(1, len(asks))) as pool:  # at once: the slowest one's time
        found = dict(zip(asks, pool.map(lambda ask: ask(), asks.values()), strict=True))
    problems = [p for p in found.values() if p]
    if problems:
        raise ServiceUnreachable("; and ".join(problems))
    return Reached(known | frozenset(found))
