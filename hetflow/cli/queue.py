"""`hetflow queue`: submit training jobs with a priority, list them, run the queue session.

    hetflow queue submit NAME [--priority high|normal|low] [--recipe R] [--steps N] ...
    hetflow queue list
    hetflow queue run [--cluster FILE] [--time-scale X] [--switch-s S] [--demo]

`submit` checks the job against the queue's cluster (its priority class, and that some
worker holds it) and leaves it in `$HETFLOW_HOME/queue/inbox/`; `run` starts the session (the
`queue` flow), which takes the inbox's jobs, and those submitted while it runs.
"""

from __future__ import annotations

import argparse
import json

from hetflow.cli.errors import say_alias
from hetflow.config import RECIPE_ALIASES, ClusterSpec, ConfigError

CLUSTER_FILE = "cluster.json"  # the cluster of the last `run`, which `submit` checks against


def add_queue_args(sub, command) -> None:
    q = command(sub, "queue", "several jobs with priorities on one cluster")
    qsub = q.add_subparsers(
        dest="queue_command",
        required=True,
        metavar="COMMAND",
        help="`hetflow queue COMMAND --help` for its own",
    )
    s = command(qsub, "submit", "queue a training job")
    s.add_argument("name", metavar="NAME", help="unique in the queue")
    s.add_argument("--priority", default="normal", help="high, normal or low")
    s.add_argument("--recipe", default="digits-cnn", help="a built-in or package.module:Name")
    s.add_argument("--steps", type=int, default=60, help="optimizer steps")
    s.add_argument("--global-batch", type=int, default=128, help="samples a step")
    s.add_argument(
        "--checkpoint-every", type=int, default=20, help="the queue moves it only at a checkpoint"
    )
    s.add_argument("--memory-gb", type=float, default=0.5, help="what one worker must hold")
    s.add_argument(
        "--arrive-after-s", type=float, default=0.0, help="seconds after the session starts"
    )
    s.set_defaults(func=cmd_queue_submit)
    ls = command(qsub, "list", "the queued jobs, and who holds which workers")
    ls.set_defaults(func=cmd_queue_list)
    r = command(qsub, "run", "run the queue session until every job has ended")
    r.add_argument("--cluster", metavar="FILE", help="default: 6 emulated workers of 3 kinds")
    r.add_argument("--time-scale", type=float, help="the emulated cluster's time scale")
    r.add_argument("--switch-s", type=float, default=15.0, help="a move's cost (relaunch)")
    r.add_argument("--demo", action="store_true", help="also the three default jobs")
    r.set_defaults(func=cmd_queue_run)


def queue_cluster_of(path: str | None = None) -> ClusterSpec:
    """`path`'s cluster, else the last `run`'s, else the queue's default."""
    from hetflow.config_queue import queue_cluster
    from hetflow.infra.paths import home

    if path:
        return ClusterSpec.from_file(path)
    last = home() / "queue" / CLUSTER_FILE
    return ClusterSpec.model_validate_json(last.read_text()) if last.exists() else queue_cluster()


# What `submit` names a QueueJob's (and its TrainConfig's) fields by: the flag the user typed.
SUBMIT_FLAGS = {
    "name": "NAME",
    "priority": "--priority",
    "recipe": "--recipe",
    "steps": "--steps",
    "global_batch": "--global-batch",
    "checkpoint_every": "--checkpoint-every",
    "eval_every": "--checkpoint-every",
    "memory_gb": "--memory-gb",
    "arrive_after_s": "--arrive-after-s",
}


def by_flag(e) -> ConfigError:
    """A pydantic error of `submit`'s job as one line naming the flag of its first problem."""
    first = e.errors()[0]
    field = next((str(p) for p in first["loc"] if not isinstance(p, int)), "")
    got = first.get("input")
    shown = "" if isinstance(got, (dict, list)) or got is None else f" (got {got!r})"
    message = first["msg"].removeprefix("Value error, ")
    return ConfigError(f"{SUBMIT_FLAGS.get(field, field or 'job')}: {message}{shown}")


def checked_job(args: argparse.Namespace, cluster: ClusterSpec):
    """The `QueueJob` of `submit`'s flags, refused in one line naming the flag (a
    ConfigError) where a value is bad, its priority is no class or no worker of `cluster`
    holds it."""
    from pydantic import ValidationError

    from hetflow.config_queue import PRIORITY_CLASSES, QueueJob, worker_memory_gb

    if args.priority not in PRIORITY_CLASSES:
        raise ConfigError(
            f"--priority: unknown class {args.priority!r}; one of {', '.join(PRIORITY_CLASSES)}"
        )
    say_alias("--recipe", args.recipe, RECIPE_ALIASES)
    fields = {f: getattr(args, f) for f in SUBMIT_FLAGS if f != "eval_every"}
    try:
        job = QueueJob.model_validate(fields)
        job.train_config()  # its recipe, steps and batch, as a train run takes them
    except ValidationError as e:
        raise by_flag(e) from None
    most = max(worker_memory_gb(cluster, i) for i in range(cluster.world_size))
    if job.memory_gb > most:
        raise ConfigError(
            f"--memory-gb: job {job.name!r} needs {job.memory_gb:g} GB a worker; the largest "
            f"worker of {cluster.name} has {most:g} GB"
        )
    return job


def cmd_queue_submit(args) -> int:
    from hetflow.infra.paths import queue_dir

    job = checked_job(args, queue_cluster_of())
    inbox = queue_dir() / "inbox"
    if (inbox / f"{job.name}.json").exists():
        raise ConfigError(f"NAME: a job {job.name!r} is already queued")
    (inbox / f"{job.name}.json").write_text(job.model_dump_json(indent=1))
    print(f"queued {job.name} ({job.priority}): `hetflow queue run` runs it")
    return 0


LIST_HEADER = ("JOB", "CLASS", "STATE", "STEPS", "ARRIVAL", "WORKERS")


def queue_rows(where) -> list[tuple[str, ...]]:
    """`hetflow queue list`'s rows: the inbox's jobs (queued, arriving that many seconds after
    the next session starts), then the last session's (`state.json`: arrived that many
    seconds after it started, the workers each holds)."""
    rows = []
    for path in sorted((where / "inbox").glob("*.json")):
        job = json.loads(path.read_text())
        arrival = f"+{job.get('arrive_after_s', 0):g}s next run"
        rows.append((job["name"], job["priority"], "queued", f"0/{job['steps']}", arrival, "-"))
    state = where / "state.json"
    for row in json.loads(state.read_text()) if state.exists() else []:
        arrived = row.get("arrived_s")
        rows.append(
            (
                row["name"],
                row["priority"],
                row["state"],
                f"{row['steps_done']}/{row['steps']}",
                "-" if arrived is None else f"+{arrived:g}s",
                ",".join(row["workers"]) or "-",
            )
        )
    return rows


def cmd_queue_list(args) -> int:
    from hetflow.infra.paths import queue_dir

    rows = queue_rows(queue_dir())
    if not rows:
        print("no job queued or run here yet: `hetflow queue submit NAME` queues one")
        return 0
    table = [LIST_HEADER, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(LIST_HEADER))]
    for r in table:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return 0


def cmd_queue_run(args) -> int:
    from hetflow.cli.commands import start_flow_logs
    from hetflow.infra.paths import queue_dir

    cluster = queue_cluster_of(args.cluster)
    if args.time_scale is not None:
        from pydantic import ValidationError

        try:
            cluster = ClusterSpec.model_validate(
                {**cluster.model_dump(), "time_scale": args.time_scale}
            )
        except ValidationError as e:
            message = e.errors()[0]["msg"]
            raise ConfigError(f"--time-scale: {message} (got {args.time_scale:g})") from None
    if args.switch_s < 0:
        raise ConfigError(f"--switch-s: a move's cost is at least 0 s (got {args.switch_s:g})")
    if not args.demo and not any((queue_dir() / "inbox").glob("*.json")):
        raise ConfigError(
            "queue: no job in the inbox: `hetflow queue submit NAME` first, or "
            "`hetflow queue run --demo`"
        )
    start_flow_logs(args)
    from hetflow.flows.job_queue import default_jobs, queue

    (queue_dir() / CLUSTER_FILE).write_text(cluster.model_dump_json())
    out = queue(jobs=default_jobs() if args.demo else [], cluster=cluster, switch_s=args.switch_s)
    print(json.dumps(out["figures"], indent=1))
    return 0
