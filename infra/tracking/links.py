"""Addresses of MLflow runs in the MLflow UI (pure), for the Prefect artifact, the CLI and the
parent run's description.

With an http(s) tracking URI the UI is that server. Otherwise (a SQLite file) there is no
server until one is started: the links point at `mlflow ui`'s default address and come with
the command that starts it (`ui_hint`). Every link opens the UI in its model-training view
(`workflowType=machine_learning`): MLflow 3's UI chooses between its GenAI and model-training
views from that query parameter, else from the user's last choice, else GenAI.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from urllib.parse import quote

UI_PORT = 5000
VIEW = "workflowType=machine_learning"


def served(tracking_uri: str) -> bool:
    """Whether the tracking URI is an MLflow server (http or https)."""
    return tracking_uri.startswith(("http://", "https://"))


def ui_base(tracking_uri: str, port: int = UI_PORT) -> str:
    """The UI's address: the server itself, or where `mlflow ui --port PORT` listens.

    >>> ui_base("http://127.0.0.1:5050/"), ui_base("sqlite:///tmp/mlflow.db")
    ('http://127.0.0.1:5050', 'http://127.0.0.1:5000')
    """
    return tracking_uri.rstrip("/") if served(tracking_uri) else f"http://127.0.0.1:{port}"


def ui_hint(tracking_uri: str, port: int = UI_PORT) -> str | None:
    """The command that serves a store that is not a server; None for a server."""
    if served(tracking_uri):
        return None
    return f"mlflow ui --backend-store-uri {tracking_uri} --port {port}"


def home_url(tracking_uri: str, port: int = UI_PORT) -> str:
    """The UI's experiments list, in its model-training view.

    >>> home_url("http://h:5000")
    'http://h:5000/#/experiments?workflowType=machine_learning'
    """
    return f"{ui_base(tracking_uri, port)}/#/experiments?{VIEW}"


def run_url(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    """One run's page.

    >>> run_url("http://h:5000", "3", "abc")
    'http://h:5000/#/experiments/3/runs/abc?workflowType=machine_learning'
    """
    return f"{ui_base(tracking_uri)}/#/experiments/{experiment_id}/runs/{run_id}?{VIEW}"


def compare_url(tracking_uri: str, experiment_id: str, run_ids: list[str]) -> str:
    """MLflow's compare view of these runs."""
    runs = quote(json.dumps(run_ids, separators=(",", ":")))
    exps = quote(json.dumps([experiment_id]))
    return f"{ui_base(tracking_uri)}/#/compare-runs?runs={runs}&experiments={exps}&{VIEW}"


def links_markdown(
    tracking_uri: str, experiment_id: str, runs: Mapping[str, str], prefect_url: str | None = None
) -> str:
    """A markdown list: each run (`label -> run id`) by id and link, the compare view of all
    but the first (the parent), the command to start the UI where needed, the Prefect flow run.
    A link's text is plain (no code span inside it): Prefect's artifact page showed the
    backticks of `[`id`](url)` as they are.
    """
    lines = ["**MLflow runs**", ""]
    hint = ui_hint(tracking_uri)
    if hint:
        lines += [f"Start the UI first: `{hint}`", ""]
    for label, rid in runs.items():
        lines.append(f"- {label}: [{rid}]({run_url(tracking_uri, experiment_id, rid)})")
    children = list(runs.values())[1:]
    if len(children) > 1:
        url = compare_url(tracking_uri, experiment_id, children)
        lines.append(f"- [{' vs '.join(list(runs)[1:])} in MLflow's compare view]({url})")
    if prefect_url:
        lines.append(f"- Prefect flow run: {prefect_url}")
    return "\n".join(lines)
