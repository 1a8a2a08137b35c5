"""The `hetflow` command line.

hetflow demo [--speeds 1,1,2,4 | --cluster FILE] [--steps N] [--json PATH]
hetflow train | profile | compare RUN_ID RUN_ID | data ingest | stack up|down|status
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from hetflow.config import (
    ClusterSpec,
    ConfigError,
    DatasetSpec,
    TrackingConfig,
    TrainConfig,
    check_job,
    default_cluster,
    describe_validation_error,
    parse_speeds,
)
from hetflow.output import write_json


class UsageError(Exception):
    pass


def _cluster(args) -> ClusterSpec:
    if getattr(args, "cluster", None) and getattr(args, "speeds", None):
        raise ConfigError("--speeds and --cluster: give one of them, not both")
    if getattr(args, "cluster", None):
        return ClusterSpec.from_file(args.cluster)
    if getattr(args, "speeds", None):
        return ClusterSpec.from_speeds(
            parse_speeds(args.speeds), name=f"speeds-{args.speeds.replace(',', '-')}"
        )
    return default_cluster()


def _train(args, **extra) -> TrainConfig:
    kw = {
        k: v
        for k, v in {
            "steps": args.steps,
            "model": args.model,
            "global_batch": args.global_batch,
            "seed": args.seed,
        }.items()
        if v is not None
    }
    return TrainConfig(**kw, **extra)


def _add_job_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--speeds", help="relative speeds of emulated workers, e.g. 1,1,2,4")
    p.add_argument("--cluster", help="cluster file (YAML or JSON, a ClusterSpec)")
    p.add_argument("--steps", type=int, help="optimizer steps per variant")
    p.add_argument("--model", help="mlp | cnn | wide_mlp")
    p.add_argument("--global-batch", type=int, dest="global_batch")
    p.add_argument("--seed", type=int)
    p.add_argument("--dataset-url", dest="dataset_url", help="s3://bucket/prefix of the dataset")
    p.add_argument("--json", dest="json_path", help="also write the results as JSON here")


def _dataset(args) -> DatasetSpec:
    return (
        DatasetSpec(url=args.dataset_url) if getattr(args, "dataset_url", None) else DatasetSpec()
    )


def _print_table(table: dict, title: str) -> None:
    from rich.table import Table

    from hetflow.infra.tracking.report import LEGEND, rows
    from hetflow.output import wide_console

    t = Table(title=title, caption=LEGEND)
    for col, justify in (
        ("metric", "left"),
        ("baseline", "right"),
        ("optimized", "right"),
        ("change", "right"),
    ):
        t.add_column(col, justify=justify)
    for row in rows(table):
        t.add_row(*row)
    wide_console(100).print(t)


def _where_to_look(tracking: TrackingConfig, urls: dict[str, str] | None = None) -> None:
    """Where the runs can be seen: the MLflow UI (with each run's page, from `urls`), Prefect."""
    from hetflow.infra.tracking import links
    from hetflow.infra.tracking.tracker import MLflowTracker

    uri = MLflowTracker(tracking).tracking_uri
    print("\nWhere to look:")
    if links.served(uri):
        print(f"  MLflow UI:  {uri}  (experiment '{tracking.experiment}')")
    else:
        print(f"  MLflow UI:  {links.ui_hint(uri)}   then open {links.ui_base(uri)}")
    for label, url in (urls or {}).items():
        print(f"    {label}: {url}")
    api = os.environ.get("PREFECT_API_URL")
    if api:
        print(f"  Prefect UI: {api.removesuffix('/api')}/runs")
    else:
        print(
            "  Prefect UI: `hetflow stack up`, export the variables it prints, "
            "and re-run to see flows there"
        )


def cmd_demo(args) -> int:
    from hetflow.flows.compare import compare

    cluster, train, dataset, tracking = (
        _cluster(args),
        _train(args),
        _dataset(args),
        TrackingConfig(),
    )
    check_job(cluster, train)
    speeds = ", ".join(f"{w.speed:g}" for w in cluster.workers)
    print(
        f"hetflow demo: {cluster.world_size} emulated workers (speeds {speeds}), "
        f"{train.model} on {dataset.source}, {train.steps} steps per variant"
    )
    t = time.perf_counter()
    out = compare(cluster=cluster, dataset=dataset, train=train, tracking=tracking)
    _print_table(out["table"], f"{cluster.name}: baseline vs optimized")
    print(
        f"demo finished in {time.perf_counter() - t:.0f}s; "
        f"MLflow runs: {out['run_ids']} (parent {out['parent_run_id']})"
    )
    write_json(args.json_path, out["table"])
    _where_to_look(tracking, out["mlflow_urls"])
    return 0


def cmd_train(args) -> int:
    from hetflow.flows.train import train as train_flow

    # the preset's batch schedule and gradient communication; the flow trains what it is given
    knobs = _train(args).model_dump(exclude={"schedule", "compression"})
    cluster, cfg = _cluster(args), TrainConfig.variant(args.variant, **knobs)
    check_job(cluster, cfg)
    out = train_flow(cluster=cluster, dataset=_dataset(args), train=cfg, variant=args.variant)
    print(json.dumps(out, indent=1))
    write_json(args.json_path, out)
    return 0


def cmd_profile(args) -> int:
    from hetflow.flows.profile_cluster import print_profile_report, profile_cluster

    cluster, cfg = _cluster(args), _train(args)
    check_job(cluster, cfg)
    profile = profile_cluster(cluster=cluster, dataset=_dataset(args), train=cfg)
    report = profile.pop("report")
    print_profile_report(report)
    # the shape at the top ({"workers": [...], "profiling_time_s"}), the raw probes beside
    write_json(args.json_path, {**report, **{k: v for k, v in profile.items() if k != "cluster"}})
    return 0


def cmd_compare(args) -> int:
    from hetflow.infra.tracking.report import comparison
    from hetflow.infra.tracking.tracker import MLflowTracker

    tracker = MLflowTracker(TrackingConfig())
    name_a, a = tracker.read_metrics(args.run_a)
    name_b, b = tracker.read_metrics(args.run_b)
    table = comparison(a, b)
    _print_table(table, f"{name_a} ({args.run_a[:8]}) vs {name_b} ({args.run_b[:8]})")
    write_json(args.json_path, table)
    return 0


def cmd_data_ingest(args) -> int:
    from hetflow.flows.prepare_dataset import prepare_dataset

    spec = DatasetSpec(
        source=args.source,
        url=args.url,
        shard_samples=args.shard_samples,
        synthetic_samples=args.samples,
    )
    manifest = prepare_dataset(dataset=spec, overwrite=True)
    print(json.dumps({k: v["samples"] for k, v in manifest["splits"].items()}))
    return 0


def cmd_stack(args) -> int:
    from hetflow import stack

    return {"up": stack.up, "down": stack.down, "status": stack.status}[args.action]()


BENCHMARKS = ("hetero", "comm", "data")


def benchmark_module(name: str):
    """`benchmarks.NAME` from the source checkout this package is installed from.

    benchmarks/ is not installed (it is measurement, not product): an editable install from a
    clone finds it beside `hetflow/`, without any edit of `sys.path`.
    """
    import importlib
    import importlib.util

    if "benchmarks" not in sys.modules:
        root = Path(__file__).resolve().parent.parent / "benchmarks"
        if not (root / "__init__.py").exists():
            raise ConfigError(
                "hetflow bench: benchmarks/ ships with the source checkout; "
                "install a clone with `pip install -e .` to run them"
            )
        spec = importlib.util.spec_from_file_location(
            "benchmarks", root / "__init__.py", submodule_search_locations=[str(root)]
        )
        package = importlib.util.module_from_spec(spec)
        sys.modules["benchmarks"] = package
        spec.loader.exec_module(package)
    return importlib.import_module(f"benchmarks.{name}")


def cmd_bench(args) -> int:
    """Each benchmark module parses its own flags: `hetflow bench NAME --help`."""
    return benchmark_module(args.name).main(args.rest)


def cmd_simulate(args) -> int:
    """The simulator parses its own flags: `hetflow simulate --help`."""
    from hetflow.simulator.cli import main as simulate

    return simulate(args.rest)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hetflow", description="Heterogeneity-aware training pipeline")
    sub = p.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="the whole job once, small: baseline vs optimized")
    _add_job_args(demo)
    demo.set_defaults(func=cmd_demo)

    tr = sub.add_parser("train", help="profile, plan and train one variant")
    _add_job_args(tr)
    tr.add_argument("--variant", choices=["baseline", "optimized"], default="optimized")
    tr.set_defaults(func=cmd_train)

    pr = sub.add_parser("profile", help="measure the workers of a cluster")
    _add_job_args(pr)
    pr.set_defaults(func=cmd_profile)

    cmp_ = sub.add_parser("compare", help="side-by-side table of two MLflow runs")
    cmp_.add_argument("run_a")
    cmp_.add_argument("run_b")
    cmp_.add_argument("--json", dest="json_path")
    cmp_.set_defaults(func=cmd_compare)

    data = sub.add_parser("data", help="datasets in S3")
    dsub = data.add_subparsers(dest="data_command", required=True)
    ing = dsub.add_parser("ingest", help="write a dataset as shards + manifest")
    ing.add_argument("--source", choices=["digits", "synthetic"], default="digits")
    ing.add_argument("--url", default=DatasetSpec().url)
    ing.add_argument("--shard-samples", type=int, default=256, dest="shard_samples")
    ing.add_argument("--samples", type=int, default=10_000, help="synthetic source size")
    ing.set_defaults(func=cmd_data_ingest)

    bench = sub.add_parser("bench", help="benchmarks that compare variants in one run")
    bench.add_argument("name", choices=BENCHMARKS)
    bench.add_argument("rest", nargs=argparse.REMAINDER, help="the benchmark's own flags")
    bench.set_defaults(func=cmd_bench)

    sim = sub.add_parser(
        "simulate", help="predict training at scale (1 to 1024 workers)", add_help=False
    )
    sim.add_argument("rest", nargs=argparse.REMAINDER, help="the simulator's own flags")
    sim.set_defaults(func=cmd_simulate)

    st = sub.add_parser("stack", help="a persistent local stack on 127.0.0.1")
    st.add_argument("action", choices=["up", "down", "status"])
    st.set_defaults(func=cmd_stack)
    return p


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Prefect makes PREFECT_HOME but not its parents; its SQLite database then cannot open
    if os.environ.get("PREFECT_HOME"):
        os.makedirs(os.path.expanduser(os.environ["PREFECT_HOME"]), exist_ok=True)
    from pydantic import ValidationError

    from hetflow.infra.datasets import DatasetError
    from hetflow.training.scheduler import PlanError

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["simulate"]:  # its flags are its own; argparse's REMAINDER would not take them
        argv = ["simulate", "--", *argv[1:]]
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, PlanError, DatasetError) as e:
        print(f"hetflow: error: {e}", file=sys.stderr)
        return 2
    except ValidationError as e:
        print(f"hetflow: error: {describe_validation_error(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
