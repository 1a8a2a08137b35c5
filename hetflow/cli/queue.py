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

from hetflow.config import ClusterSpec, ConfigError

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


def checked_job(args: argparse.Namespace, cluster: ClusterSpec):
    """The `QueueJob` of `submit`'s flags, refused in one line (a ConfigError) where its
    priority is no class or no worker of `cluster` holds it."""
    from hetflow.config_queue import QueueJob, worker_memory_gb
    from hetflow.queue.jobs import QueueError, check_priority

    try:
        check_priority(args.priority)
    except QueueError as e:
        raise ConfigError(str(e)) from None
    most = max(worker_memory_gb(cluster, i) for i in range(cluster.world_size))
    if args.memory_gb > most:
        raise ConfigError(
            f"memory_gb: job {args.name!r} needs {args.memory_gb:g} GB a worker; the largest "
            f"worker of {cluster.name} has {most:g} GB"
        )
    job = QueueJob(
        name=args.name,
        priority=args.priority,
        recipe=args.recipe,
        steps=args.steps,
        global_batch=args.global_batch,
        checkpoint_every=args.checkpoint_every,
        memory_gb=args.memory_gb,
        arrive_after_s=args.arrive_after_s,
    )
    job.train_config()  # its recipe, steps and batch, as a train run takes them
    return job


def cmd_queue_submit(args) -> int:
    from hetflow.infra.paths import queue_dir

    job = checked_job(args, queue_cluster_of())
    inbox = queue_dir() / "inbox"
    if (inbox / f"{job.name}.json").exists():
        raise ConfigError(f"name: a job {job.name!r} is already queued")
    (inbox / f"{job.name}.json").write_text(job.model_dump_json(indent=1))
    print(f"queued {job.name} ({job.priority}): `hetflow queue run` runs it")
    return 0


def cmd_queue_list(args) -> int:
    from hetflow.infra.paths import queue_dir

    where = queue_dir()
    lines = []
    for path in sorted((where / "inbox").glob("*.json")):
        job = json.loads(path.read_text())
        lines.append(f"{job['name']:<20} {job['priority']:<7} queued")
    state = where / "state.json"
    for row in json.loads(state.read_text()) if state.exists() else []:
        held = ",".join(row["workers"]) or "-"
        lines.append(
            f"{row['name']:<20} {row['priority']:<7} {row['state']:<8} "
            f"{row['steps_done']}/{row['steps']} steps  workers {held}"
        )
    print(
        "\n".join(lines) or "no job queued or run here yet: `hetflow queue submit NAME` queues one"
    )
    return 0


def cmd_queue_run(args) -> int:
    from hetflow.cli.commands import start_flow_logs
    from hetflow.infra.paths import queue_dir

    cluster = queue_cluster_of(args.cluster)
    if args.time_scale is not None:
        cluster = ClusterSpec.model_validate(
            {**cluster.model_dump(), "time_scale": args.time_scale}
        )
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
