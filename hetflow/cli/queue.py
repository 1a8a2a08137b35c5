"""`hetflow queue`: submit training jobs with a priority, list them, run the queue session.

    hetflow queue submit NAME [--priority high|normal|low] [--recipe R] [--steps N] ...
    hetflow queue list
    hetflow queue run [--cluster FILE] [--time-scale X] [--switch-s S] [--policy P] [--demo]
                      [--launcher local|ray] [--ray-address ADDRESS]
    hetflow queue cancel NAME

`submit` checks the job against the queue's cluster (its priority class, that some worker
holds it, and that its recipe imports and reads the session's data: `cli.queue_checks`) and
leaves it in `$HETFLOW_HOME/queue/inbox/`; `run` starts the session (the `queue` flow), which
takes the inbox's jobs, and those submitted while it runs, under the allocator or `--policy
fifo` (first come, first served, blind to the device type), each job's segments under the
cluster's launcher or `--launcher` (`ray`: on the Ray cluster at `--ray-address`, each worker
on a node of its instance type, checked before the session starts: `cli.queue_checks`).
`cancel` takes a job out of the
inbox, or asks the running session to end it (`tasks.queue_ends`).
"""

from __future__ import annotations

import argparse
import json

from hetflow.cli.errors import say_alias
from hetflow.config import RECIPE_ALIASES, ClusterSpec, ConfigError
from hetflow.config.queue import QUEUE_POLICIES

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
    s.add_argument("--workers", type=int, help="under --policy fifo: how many (default: all)")
    s.add_argument(
        "--in-place",
        action="store_true",
        help="elastic: the queue takes and gives it workers at a step, no relaunch",
    )
    s.set_defaults(func=cmd_queue_submit)
    ls = command(qsub, "list", "the queued jobs, and who holds which workers")
    ls.set_defaults(func=cmd_queue_list)
    add_run_args(command(qsub, "run", "run the queue session until every job has ended"))
    c = command(qsub, "cancel", "take a queued job out, or stop a running one at its checkpoint")
    c.add_argument("name", metavar="NAME", help="the job, as `hetflow queue list` names it")
    c.set_defaults(func=cmd_queue_cancel)


def add_run_args(r) -> None:
    """`hetflow queue run`'s flags."""
    r.add_argument("--cluster", metavar="FILE", help="default: 6 emulated workers of 3 kinds")
    r.add_argument("--time-scale", type=float, help="the emulated cluster's time scale")
    r.add_argument("--switch-s", type=float, default=15.0, help="a move's cost (relaunch)")
    r.add_argument(
        "--policy",
        choices=QUEUE_POLICIES,
        default="allocator",
        help="fifo: first come, first served, blind to the device type",
    )
    r.add_argument(
        "--measure-first",
        action="store_true",
        help="the allocator profiles each job's unknown worker kinds before placing it "
        "(default: places it from a prior and learns from its steps)",
    )
    r.add_argument("--demo", action="store_true", help="also the three default jobs")
    r.add_argument(
        "--launcher",
        choices=("local", "ray"),
        help="local: torchrun on this host (default, unless --cluster says); ray: Ray Train on "
        "the Ray cluster at --ray-address, each worker on a node of its instance type",
    )
    r.add_argument(
        "--ray-address",
        "--address",
        dest="ray_address",
        help="the Ray cluster's address (default: $RAY_ADDRESS, else auto)",
    )
    r.set_defaults(func=cmd_queue_run)


def queue_cluster_of(path: str | None = None) -> ClusterSpec:
    """`path`'s cluster, else the last `run`'s, else the queue's default."""
    from hetflow.config.queue import queue_cluster
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
    "workers": "--workers",
    "in_place": "--in-place",
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
    ConfigError) where a value is bad, its priority is no class, no worker of `cluster`
    holds it, or it could not run there (`queue_checks.check_runnable`: its recipe, its
    data)."""
    from pydantic import ValidationError

    from hetflow.config.queue import PRIORITY_CLASSES, QueueJob, worker_memory_gb

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
    from hetflow.cli.queue_checks import check_runnable

    check_runnable(job, cluster, SUBMIT_FLAGS)
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


LIST_HEADER = ("JOB", "CLASS", "STATE", "STEPS", "ARRIVAL", "WORKERS", "REASON")


def queue_rows(where) -> list[tuple[str, ...]]:
    """`hetflow queue list`'s rows: the inbox's jobs (queued, arriving that many seconds after
    the next session starts), then the last session's (`state.json`: arrived that many
    seconds after it started, the workers each holds)."""
    rows = []
    for path in sorted((where / "inbox").glob("*.json")):
        job = json.loads(path.read_text())
        arrival = f"+{job.get('arrive_after_s', 0):g}s next run"
        row = (job["name"], job["priority"], "queued", f"0/{job['steps']}", arrival, "-", "")
        rows.append(row)
    for row in session_rows(where):
        arrived = row.get("arrived_s")
        rows.append(
            (
                row["name"],
                row["priority"],
                row["state"],
                f"{row['steps_done']}/{row['steps']}",
                "-" if arrived is None else f"+{arrived:g}s",
                ",".join(row["workers"]) or "-",
                row.get("reason", ""),
            )
        )
    return rows


def session_rows(where) -> list[dict]:
    """The last session's jobs as it wrote them (`state.json`); none before a first run."""
    state = where / "state.json"
    return json.loads(state.read_text()) if state.exists() else []


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


def failures_said(where) -> int:
    """`run`'s exit status: 1 where a job of the session failed (each named on stderr, with
    its reason), else 0 (every job done or cancelled)."""
    import sys

    failed = [r for r in session_rows(where) if r["state"] == "failed"]
    for r in failed:
        print(f"hetflow: job {r['name']} failed: {r.get('reason', '')}", file=sys.stderr)
    return 1 if failed else 0


def cmd_queue_cancel(args) -> int:
    """A queued job taken out of the inbox; a job of the session asked to end (at once where
    it holds no workers, else at its next checkpoint); a one-line error for a name the queue
    does not know or a job that has ended."""
    import re

    from hetflow.config.queue import CANCEL_FOLDER, ENDED_STATES, JOB_NAME
    from hetflow.infra.paths import queue_dir

    where, name = queue_dir(), args.name
    if not re.match(JOB_NAME, name):  # it names files: never a path
        raise ConfigError(f"NAME: {name!r} is no job's name (`hetflow queue list` names them)")
    try:
        (where / "inbox" / f"{name}.json").unlink()
    except FileNotFoundError:
        pass  # not queued, or the session took it in meanwhile
    else:
        print(f"cancelled {name}: taken out of the queue before it ran")
        return 0
    row = next((r for r in reversed(session_rows(where)) if r["name"] == name), None)
    if row is None:
        raise ConfigError(f"NAME: no job {name!r} in the queue (`hetflow queue list` names them)")
    if row["state"] in ENDED_STATES:
        raise ConfigError(f"NAME: job {name!r} has already ended ({row['state']})")
    (where / CANCEL_FOLDER).mkdir(exist_ok=True)
    (where / CANCEL_FOLDER / name).touch()
    if row["state"] in ("running", "cancelling"):
        print(f"cancelling {name}: it stops at its next checkpoint (`hetflow queue list`)")
    else:
        print(f"cancelling {name}: the running session takes it out at its next look")
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
    from hetflow.cli.queue_checks import check_launcher

    cluster = check_launcher(cluster, args.launcher, args.ray_address)
    start_flow_logs(args)
    from hetflow.flows.job_queue import default_jobs, queue

    (queue_dir() / CLUSTER_FILE).write_text(cluster.model_dump_json())
    jobs = default_jobs() if args.demo else []
    out = queue(
        jobs=jobs,
        cluster=cluster,
        switch_s=args.switch_s,
        policy=args.policy,
        measure_first=args.measure_first,
    )
    print(json.dumps(out["figures"], indent=1))
    return failures_said(queue_dir())
