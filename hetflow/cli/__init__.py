"""The `hetflow` command line.

    hetflow demo [--speeds 1,1,2,4 | --cluster FILE] [--steps N] [--json PATH] [--phases]
    hetflow train | profile | compare RUN_ID RUN_ID | data ingest|ls | stack up|down|status
    hetflow bench NAME ... | simulate ... | recommend [--candidates TYPE:N,...]
    hetflow queue submit NAME --priority high|normal|low ... | list | run | cancel NAME

`hetflow COMMAND --help` lists a command's options with their defaults. Bad input, from a
mistyped option to a run id MLflow does not hold, is refused in one line on stderr,
`hetflow: error: ...`, with exit status 2. Importing this package and parsing loads neither
Prefect, MLflow nor torch: a command imports them once its input is valid. Importing the
package alone loads only the argument helpers (`hetflow.cli.args`: the standard library and
`hetflow.errors`): the commands' modules are imported when the parser is built, so that a
benchmark that takes its flags from `hetflow.cli.args` imports nothing of the CLI's commands.
"""

from __future__ import annotations

import argparse
import os
import sys

from hetflow.cli.args import Parser, UsageError

__all__ = ["UsageError", "build_parser", "main", "one_line"]


def __getattr__(name: str):
    """`one_line` (`hetflow.cli.errors`, over the config models), imported when asked for."""
    if name == "one_line":
        from hetflow.cli.errors import one_line

        return one_line
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _command(sub, name: str, summary: str, **kwargs) -> argparse.ArgumentParser:
    """A subcommand whose summary is both its line in the list and its help's description."""
    return sub.add_parser(name, help=summary, description=summary, **kwargs)


def _add_job_commands(sub) -> None:
    from hetflow.cli import commands
    from hetflow.cli.job import add_job_args

    demo = _command(sub, "demo", "the whole job once, small: baseline vs optimized")
    add_job_args(demo)
    demo.add_argument(
        "--phases",
        action="store_true",
        help="also each worker's launch by phase (spawn, import, rendezvous, data, model, "
        "first step) in each variant",
    )
    demo.set_defaults(func=commands.cmd_demo)

    tr = _command(sub, "train", "profile, plan and train one variant")
    add_job_args(tr)
    tr.add_argument(
        "--variant",
        choices=["baseline", "optimized"],
        default="optimized",
        help="baseline: equal split, no compression; optimized: planned, re-balanced",
    )
    tr.set_defaults(func=commands.cmd_train)

    pr = _command(sub, "profile", "measure the workers of a cluster")
    add_job_args(pr)
    pr.set_defaults(func=commands.cmd_profile)


def _add_other_commands(sub) -> None:
    from hetflow.cli import commands
    from hetflow.cli.job import add_ingest_args
    from hetflow.cli.queue import add_queue_args
    from hetflow.cli.recommend import add_recommend_args, cmd_recommend

    cmp_ = _command(sub, "compare", "side-by-side table of two MLflow runs")
    cmp_.add_argument("run_a", metavar="RUN_ID", help="the first MLflow run (its full id)")
    cmp_.add_argument("run_b", metavar="RUN_ID", help="the second MLflow run")
    cmp_.add_argument("--json", dest="json_path", metavar="PATH", help="also write the table here")
    cmp_.set_defaults(func=commands.cmd_compare)

    data = _command(sub, "data", "datasets in S3")
    dsub = data.add_subparsers(
        dest="data_command", required=True, metavar="COMMAND", help="what to do with a dataset"
    )
    ing = _command(dsub, "ingest", "write a dataset as shards + manifest")
    add_ingest_args(ing)
    ing.set_defaults(func=commands.cmd_data_ingest)
    ls = _command(dsub, "ls", "list the datasets under a URL (default: the local S3 store)")
    ls.add_argument(
        "url",
        nargs="?",
        metavar="URL",
        help="s3://BUCKET/PREFIX, file:// or a folder (default: every dataset in S3: with none "
        "configured, the local store under $HETFLOW_HOME/s3)",
    )
    ls.set_defaults(func=commands.cmd_data_ls)

    bench = _command(sub, "bench", "benchmarks that compare variants in one run")
    bench.add_argument("name", choices=commands.BENCHMARKS, help="the benchmark")
    bench.add_argument("rest", nargs=argparse.REMAINDER, help="the benchmark's own flags")
    bench.set_defaults(func=commands.cmd_bench)

    sim = _command(sub, "simulate", "predict training at scale (1 to 1024 workers)", add_help=False)
    sim.add_argument("rest", nargs=argparse.REMAINDER, help="the simulator's own flags")
    sim.set_defaults(func=commands.cmd_simulate)

    cl = _command(sub, "cluster", "cloud clusters for the Ray launcher")
    csub = cl.add_subparsers(dest="cluster_command", required=True, metavar="COMMAND", help="what")
    conf = _command(csub, "config", "write a Ray cluster-launcher YAML for AWS (`ray up` it)")
    conf.add_argument("cluster_file", metavar="CLUSTER.yaml", help="a cluster spec naming types")
    conf.add_argument("--output", "-o", metavar="PATH", help="write here (default: stdout)")
    conf.add_argument("--region", default="us-east-1", help="AWS region")
    conf.add_argument("--image-id", dest="image_id", help="the AMI (default: Ray's for the region)")
    conf.set_defaults(func=commands.cmd_cluster_config)

    rec = _command(sub, "recommend", "which instances to rent for a job, and its batch plan")
    add_recommend_args(rec)
    rec.set_defaults(func=cmd_recommend)

    add_queue_args(sub, _command)

    st = _command(sub, "stack", "a persistent local stack on 127.0.0.1")
    st.add_argument("action", choices=["up", "down", "status"], help="what to do with it")
    st.set_defaults(func=commands.cmd_stack)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="hetflow", description="Heterogeneity-aware training pipeline")
    sub = p.add_subparsers(
        dest="command",
        required=True,
        metavar="COMMAND",
        help="`hetflow COMMAND --help` for its own",
    )
    _add_job_commands(sub)
    _add_other_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Prefect's temporary server gets 20 s to start by default: on a busy 2-core host that is
    # not always enough ("Timed out while attempting to connect to ephemeral Prefect API
    # server"), so wait as long as the test harness does; a value the user set is kept
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    # Prefect makes PREFECT_HOME but not its parents; its SQLite database then cannot open
    if os.environ.get("PREFECT_HOME"):
        os.makedirs(os.path.expanduser(os.environ["PREFECT_HOME"]), exist_ok=True)
    as_program = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["simulate"]:  # its flags are its own; argparse's REMAINDER would not take them
        argv = ["simulate", "--", *argv[1:]]
    try:
        args = build_parser().parse_args(argv)
        args.run_log = as_program  # a flow's log to the run's log file (commands.start_flow_logs)
        return args.func(args)
    except Exception as e:
        from hetflow.cli.errors import one_line

        message = one_line(e)
        if message is None:
            raise  # a bug: its traceback
        from hetflow.cli.logs import record_user_error

        log = record_user_error(e, message)
        where = f" (traceback in {log})" if log else ""
        print(f"hetflow: error: {message}{where}", file=sys.stderr)
        return 2
