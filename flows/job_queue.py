"""Flow: several training jobs on one cluster, with priorities, each job given the workers
it runs best on and moved at its checkpoints, or in place at a step where it runs elastic
(`tasks.queue_session`)."""

from __future__ import annotations

from typing import Annotated, Literal

from prefect import flow
from prefect.artifacts import create_markdown_artifact
from pydantic import Field
from pydantic.json_schema import SkipJsonSchema

from hetflow.config import ConfigError, DatasetSpec, TrackingConfig
from hetflow.config.queue import CANCEL_FOLDER, ENDED_STATES, QueueJob, queue_cluster
from hetflow.flows.forms import Cluster, Dataset, Job, titled
from hetflow.infra.paths import queue_dir
from hetflow.infra.report.plots import worker_timeline
from hetflow.infra.s3 import local_s3_endpoint
from hetflow.infra.tracking.tracker import MLflowTracker
from hetflow.queue.jobs import QueueError
from hetflow.tasks.data import ingest_dataset
from hetflow.tasks.opening import reach_services
from hetflow.tasks.queue import ensure_slots, inbox_reader
from hetflow.tasks.queue_session import Session


def default_jobs() -> list[QueueJob]:
    """Three small digits jobs, one per class, the higher ones arriving later."""
    return [
        QueueJob(name="digits-low", priority="low", steps=60),
        QueueJob(name="digits-normal", priority="normal", steps=40, arrive_after_s=20),
        QueueJob(name="digits-high", priority="high", steps=40, arrive_after_s=40),
    ]


def figures(session: Session) -> tuple[dict[str, float], list[dict]]:
    """(the session's figures for MLflow, over the jobs that ran to their end, with how many
    failed and were cancelled; one row per job that ran to its end)."""
    rows = []
    done = [j for j in session.jobs if j.ended == "done"]
    counts = {f"jobs_{s}": sum(j.ended == s for j in session.jobs) for s in ENDED_STATES}
    if not done:
        return counts | {"measuring_s": session.measuring_s}, rows
    for j in done:
        last = j.segments[-1]
        rows.append(
            {
                "job": j.job.name,
                "priority": j.job.priority,
                "wait_s": round(j.started_s - j.arrived_s, 1),
                "completion_s": round(j.finished_s - j.arrived_s, 1),
                "segments": len(j.segments),
                "moved_in_place": session.moves.count(j.job.name),
                "grown_in_place": session.moves.grown(j.job.name),
                "steps_redone": last.steps_redone,
                "launch_s": round(sum(s.wall_s - s.train_s for s in j.segments), 1),
                "train_s": round(sum(s.train_s for s in j.segments), 1),
            }
        )
    out = counts | {
        "avg_job_completion_s": sum(r["completion_s"] for r in rows) / len(rows),
        "makespan_s": max(j.finished_s for j in done) - min(j.arrived_s for j in done),
        "steps_redone": sum(r["steps_redone"] for r in rows),
        "segments": sum(r["segments"] for r in rows),
        "measuring_s": session.measuring_s,
        "moves_in_place": sum(r["moved_in_place"] for r in rows),
        "grows_in_place": sum(r["grown_in_place"] for r in rows),
        "in_place_s": session.moves.cost_s,
        "warm_ranks": session.pool.given.total() if session.pool is not None else 0,
        "warm_joins": session.pool.given["join"] if session.pool is not None else 0,
        "warm_agents": session.agents.given.total() if session.agents is not None else 0,
    }
    out |= {f"{r['job']}/wait_s": r["wait_s"] for r in rows}
    return out, rows


def ended_badly(session: Session) -> list[dict]:
    """One row per job that failed or was cancelled: its state and why."""
    return [
        {"job": j.job.name, "priority": j.job.priority, "state": j.ended, "reason": j.reason}
        for j in session.jobs
        if j.ended in ("failed", "cancelled")
    ]


def table(rows: list[dict]) -> str:
    if not rows:
        return ""
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(str(r[h]) for h in head) + " |" for r in rows]
    return "\n".join(lines)


# What the queue form starts from: one small digits job (Python callers pass none by default).
FORM_JOB = QueueJob(name="digits-1", steps=40)
JOB_TITLE = {"title": "Job", "description": "The training job this run submits to the queue."}
FormJob = Annotated[
    Job | SkipJsonSchema[None],
    Field(json_schema_extra={"default": FORM_JOB.model_dump(), **JOB_TITLE}),
]
SwitchCost = Annotated[
    float, titled("Cost of a move (s)", "What moving a job to other workers costs (its relaunch).")
]
# Whether the session also runs the inbox's jobs (`hetflow queue submit`), then and later: on
# in a form's run (the form holds about a dozen fields), off from the deployment's parameters.
ReadInbox = SkipJsonSchema[bool | None]
Launcher = Annotated[
    Literal["cluster", "local", "ray"],
    titled(
        "Launcher",
        "cluster: as the cluster says; local: every job's runs under torchrun on this host; "
        "ray: on the Ray cluster at the cluster's Ray address, each worker on a node labelled "
        "with its instance type.",
    ),
]
Policy = Annotated[
    Literal["allocator", "fifo"],
    titled(
        "Policy",
        "allocator: each job the workers it runs best on, moved at checkpoints; fifo: first "
        "come, first served, blind to the device type (the baseline).",
    ),
]


def given_jobs(job, jobs, read_inbox, where) -> list[QueueJob]:
    """The form's `job` and `jobs`, their names unique, and some job to run (given, or in the
    inbox of `where` where the session reads it); a one-line ConfigError naming `jobs`."""
    jobs = ([job] if job is not None else []) + list(jobs)
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        raise ConfigError(f"jobs: names must be unique, got {names}")
    if not jobs and not (read_inbox and any((where / "inbox").glob("*.json"))):
        raise ConfigError("jobs: none given and none in the inbox (`hetflow queue submit`)")
    return jobs


@flow(name="queue", log_prints=True)
def queue(
    job: FormJob = None,
    cluster: Cluster = queue_cluster(),
    dataset: Dataset = DatasetSpec(),
    tracking: SkipJsonSchema[TrackingConfig] = TrackingConfig(),
    switch_s: SwitchCost = 15.0,
    read_inbox: ReadInbox = True,
    jobs: SkipJsonSchema[list[QueueJob]] = [],  # noqa: B006 (never mutated)
    policy: Policy = "allocator",
    launcher: Launcher = "cluster",
    in_place_s: SkipJsonSchema[float] = 1.0,
    measure_first: SkipJsonSchema[bool] = False,
    published_prior: SkipJsonSchema[bool] = True,
) -> dict:
    """Run `job`, `jobs` and the inbox's (`hetflow queue submit`) on `cluster`, each job's run
    nested under the session's MLflow run (figures, who held which worker when). The form
    submits one `job`; `jobs`, `tracking` and `in_place_s` come from the deployment's
    parameters or Python.
    `switch_s`: a move's cost (its relaunch), weighed against what the move gains (a move in
    place: `in_place_s` until one is measured, `queue_moves.Moves.cost_s`); `policy`:
    the allocator, or `fifo` (`hetflow.queue.fifo`), recorded as the session run's param;
    `launcher`: where each job's segments run (`local`, `ray`; `cluster`: the cluster's
    own); the stop requests travel as its ranks read them (`tasks.queue.job_stop_channel`).
    `measure_first`: the allocator profiles a job's worker kinds the history lacks before
    placing it (`tasks.queue.job_model`), where by default it places it from a prior and its
    steps set the prior's unit (`tasks.queue.job_prior`, `tasks.queue_pace`); not
    `published_prior`: that prior is the equal split, not the presets' published ratios."""
    if launcher != "cluster":
        cluster = cluster.model_copy(update={"launcher": launcher})
    where = queue_dir()
    jobs = given_jobs(job, jobs, read_inbox, where)
    reach_services(dataset, tracking)
    with local_s3_endpoint(dataset.url):
        ingest_dataset(dataset)
        ensure_slots(cluster)
        tracker = MLflowTracker(tracking)
        parent = tracker.start_run("queue", cluster, dataset)
        first = str(measure_first)
        params = {"policy": policy, "launcher": cluster.launcher, "measure_first": first}
        tracker.log_params(parent, params)
        out = {"parent_run_id": parent, "policy": policy}
        inbox = inbox_reader(where / "inbox" if read_inbox else None)
        files = {"state": where / "state.json", "cancels": where / CANCEL_FOLDER}
        how = {"policy": policy, "in_place_s": in_place_s, "measure_first": measure_first}
        how["published_prior"] = published_prior
        session = Session(cluster, dataset, tracking, parent, switch_s, inbox, **files, **how)
        try:
            session.run(jobs)
        except QueueError as e:
            tracker.fail(parent, str(e))
            raise ConfigError(str(e)) from None
        except Exception as e:
            tracker.fail(parent, f"queue: {e}")
            raise
        if not session.jobs:
            tracker.finish(parent)
            print("queue: no jobs (hetflow queue submit NAME queues one)")
            return out | {"figures": {}, "jobs": [], "spans": [], "moves": [], "units": []}
        out |= record(session, tracker, parent, [w.name for w in cluster.workers])
    return out


def record(session: Session, tracker: MLflowTracker, parent: str, order: list[str]) -> dict:
    """The ended session in its MLflow run (figures, who held which worker when, the moves
    in place) and a Prefect artifact; what the flow returns of it."""
    values, rows = figures(session)
    tracker.log_metrics(parent, values)
    tracker.log_plots(parent, {"queue_workers.png": worker_timeline(session.spans, order)})
    moves = session.moves.figures()
    units = session.units.found  # when the jobs' steps set a prior's unit
    logged = {"jobs": rows, "spans": session.spans, "moves": moves, "units": units}
    tracker.log_json(parent, "queue.json", logged)
    md = "\n\n".join(t for t in (table(rows), table(ended_badly(session))) if t)
    create_markdown_artifact(md, key="queue", description="the queue's jobs")
    tracker.finish(parent)
    print(f"queue ({session.policy}):\n{md}")
    return {"figures": values, "jobs": rows, "spans": session.spans, "moves": moves, "units": units}
