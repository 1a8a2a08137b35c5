"""What each `hetflow` command does, once its flags are parsed.

Every command validates its input first (`hetflow.cli.job`: into one resolved job) and probes
the services once (`reachable`), and imports Prefect and MLflow only after that: bad input is
refused before anything slow is started. It passes both answers to its flow (`job`,
`reached`), which checks neither again.
"""

from __future__ import annotations

import importlib
import json
import os
import textwrap
import time
from pathlib import Path

from hetflow.cli.checks import before_flow, check_ingest_source
from hetflow.cli.job import ingest_of, job_of
from hetflow.config import ConfigError, TrackingConfig
from hetflow.output import write_json

BENCHMARKS = (
    "hetero",
    "comm",
    "data",
    "host",
    "noise",
    "lr_rule",
    "recommend",
    "fsdp",
    "gpu_all",
    "diloco",
    "queue",
    "learner",
    "trial_straggler",
)


def _print_table(
    table: dict, title: str, notes: list[str] | tuple[str, ...] = (), lead: str = ""
) -> None:
    """`lead` (who won: `verdict.verdict`), the table, its legend, and under it the `notes`
    (`report.notes`), one bullet each."""
    from rich.table import Table

    from hetflow.infra.report.table import LEGEND, rows
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
    console = wide_console(100)
    if lead:
        print(textwrap.fill(lead, console.width))
    console.print(t)
    for note in notes:
        print(textwrap.fill(note, console.width, initial_indent="- ", subsequent_indent="  "))


def _print_phases(startup: dict, table: dict) -> None:
    """Each variant's workers' launch by phase (`report.launch_phases`), a row per worker, and
    rank 0's trials ('auto''s compression trials, part of its start-up)."""
    from rich.table import Table

    from hetflow.infra.report.table import PHASES
    from hetflow.output import wide_console

    t = Table(title="launch by phase, s (from submit to the first step)")
    columns = (*PHASES, "trials", "startup")
    for name in ("variant", "worker", *columns):
        t.add_column(name.replace("_", " "), justify="left" if name == "variant" else "right")
    for variant, ranks in startup.items():
        for r, phases in ranks.items():
            trials = table.get(variant, {}).get("trials_s") if r == 0 else None
            got = {**phases, "trials": phases.get("trials", trials)}
            cells = ["-" if got.get(c) is None else f"{got[c]:.2f}" for c in columns]
            t.add_row(variant, f"w{r}", *cells)
    wide_console(100).print(t)


def _print_runs(parent: str, run_ids: dict[str, str]) -> None:
    """The MLflow runs of a comparison, one a line, and the command that prints the table again."""
    print("MLflow runs:")
    print(f"  {'compare':<10} {parent}  (parent)")
    for variant, run_id in run_ids.items():
        print(f"  {variant:<10} {run_id}")
    print(f"  the table again: hetflow compare {' '.join(run_ids.values())}")


def _where_to_look(tracking: TrackingConfig, urls: dict[str, str] | None = None) -> None:
    """Where the runs can be seen: the MLflow UI (with each run's page, from `urls`), Prefect.

    A store that is no server gets the `mlflow ui` command on MLflow's default port, the one
    the links inside the runs (descriptions, comparison.md) point at, so that one address
    serves both; where that port is taken now, the line says so."""
    from hetflow.infra.tracking import links
    from hetflow.infra.tracking.tracker import MLflowTracker
    from hetflow.stack.processes import port_open

    uri = MLflowTracker(tracking).tracking_uri
    print("\nWhere to look:")
    if links.served(uri):
        print(f"  MLflow UI:  {links.home_url(uri)}  (experiment '{tracking.experiment}')")
    else:
        print(f"  MLflow UI:  {links.ui_hint(uri)}   then open {links.home_url(uri)}")
        if port_open(links.UI_PORT):
            print(
                f"    (port {links.UI_PORT} is in use now: free it first, or the run pages' "
                "links will not open)"
            )
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


def reachable(dataset_url: str | None = None, tracking: TrackingConfig | None = None, cluster=None):
    """The services the command will use answer (the Prefect API when PREFECT_API_URL is set,
    S3 for `dataset_url`, MLflow for `tracking`, the Ray cluster of a `cluster` on the ray
    launcher); else one line naming each dead endpoint, within seconds, before Prefect, MLflow
    or torch is imported (`hetflow.infra.preflight`). Returns what answered (`Reached`), for
    the command's flow."""
    from hetflow.infra.preflight import check_services

    ray = None
    if cluster is not None and cluster.launcher == "ray":
        ray = cluster.ray_address or os.environ.get("RAY_ADDRESS") or "auto"
    return check_services(dataset_url, tracking, prefect=True, ray_address=ray)


def start_flow_logs(args) -> None:
    """Called as the program (`main` sets `args.run_log`), before the command imports its
    flow: Prefect's log goes to the run's log file too, and a user error's records stay off
    the terminal (`hetflow.cli.logs`). Called from Python (tests), the caller's logging is
    left as it is."""
    if getattr(args, "run_log", False):
        from hetflow.cli.logs import route_prefect_logs

        name = "-".join(filter(None, (args.command, getattr(args, "data_command", None))))
        route_prefect_logs(name)


def cmd_demo(args) -> int:
    cluster, train, dataset, job = job_of(args, compare=True)
    tracking = TrackingConfig()
    reached = reachable(dataset.url, tracking, cluster)
    before_flow(job, dataset)
    start_flow_logs(args)
    speeds = ", ".join(f"{w.speed:g}" for w in cluster.workers)
    print(
        f"hetflow demo: {cluster.world_size} emulated workers (speeds {speeds}), "
        f"{train.recipe} on {dataset.url if dataset.source == 'existing' else dataset.source}, "
        f"{train.steps} steps per variant"
    )
    from hetflow.flows.compare import compare

    t = time.perf_counter()
    out = compare(
        cluster=cluster, dataset=dataset, train=train, tracking=tracking, job=job, reached=reached
    )
    title = f"{cluster.name}: baseline vs optimized"
    _print_table(out["table"], title, out["notes"], out.get("verdict", ""))
    if getattr(args, "phases", False):
        _print_phases(out["startup"], out["table"])
    print(f"demo finished in {time.perf_counter() - t:.0f}s")
    _print_runs(out["parent_run_id"], out["run_ids"])
    # the table's two variants, the order they ran in (`compare`'s docstring), and each
    # worker's launch by phase
    write_json(args.json_path, {**out["table"], "order": out["order"], "startup": out["startup"]})
    _where_to_look(tracking, out["mlflow_urls"])
    return 0


def cmd_train(args) -> int:
    # the variant's preset batch schedule and gradient communication, the flags' other knobs;
    # the flow trains what it is given
    cluster, cfg, dataset, job = job_of(args, variant=args.variant)
    reached = reachable(dataset.url, TrackingConfig(), cluster)
    before_flow(job, dataset)
    start_flow_logs(args)
    from hetflow.flows.train import train as train_flow

    out = train_flow(
        cluster=cluster, dataset=dataset, train=cfg, variant=args.variant, job=job, reached=reached
    )
    print(json.dumps(out, indent=1))
    write_json(args.json_path, out)
    return 0


def cmd_profile(args) -> int:
    cluster, cfg, dataset, job = job_of(args)
    reached = reachable(dataset.url, TrackingConfig(), cluster)
    before_flow(job, dataset)
    start_flow_logs(args)
    from hetflow.flows.profile_cluster import print_profile_report, profile_cluster

    profile = profile_cluster(cluster=cluster, dataset=dataset, train=cfg, job=job, reached=reached)
    report = profile.pop("report")
    print_profile_report(report)
    # the shape at the top ({"workers": [...], "profiling_time_s"}), the raw probes beside
    write_json(args.json_path, {**report, **{k: v for k, v in profile.items() if k != "cluster"}})
    return 0


def cmd_compare(args) -> int:
    reachable(tracking=TrackingConfig())
    from hetflow.infra.report.notes import notes
    from hetflow.infra.report.table import comparison
    from hetflow.infra.report.verdict import verdict
    from hetflow.infra.tracking.tracker import MLflowTracker, RunNotFound

    tracker = MLflowTracker(TrackingConfig())
    found, missing = {}, []
    for run_id in dict.fromkeys((args.run_a, args.run_b)):
        try:
            found[run_id] = tracker.read_metrics(run_id)
        except RunNotFound:
            missing.append(repr(run_id))
    if missing:
        runs = f"run {missing[0]}" if len(missing) == 1 else f"runs {' and '.join(missing)}"
        raise ConfigError(f"compare: no {runs} in MLflow at {tracker.tracking_uri}")
    (name_a, a), (name_b, b) = found[args.run_a], found[args.run_b]
    table = comparison(a, b)
    title = f"{name_a} ({args.run_a[:8]}) vs {name_b} ({args.run_b[:8]})"
    _print_table(table, title, notes(a, b, names=(name_a, name_b)), verdict(a, b))
    write_json(args.json_path, table)
    return 0


def cmd_data_ingest(args) -> int:
    spec = ingest_of(args)
    reachable(spec.url)
    check_ingest_source(spec)
    start_flow_logs(args)
    from hetflow.flows.prepare_dataset import prepare_dataset

    manifest = prepare_dataset(dataset=spec, overwrite=True)
    print(json.dumps({k: v["samples"] for k, v in manifest["splits"].items()}))
    return 0


def cmd_data_ls(args) -> int:
    """One line per dataset under the URL; with no S3 configured, read from the local store on
    disk (`infra.s3_store`), no endpoint started."""
    from hetflow.infra.data.listing import find_datasets, s3_target

    if (not args.url or args.url.startswith("s3://")) and s3_target(args.url) is not None:
        from hetflow.infra.preflight import check_services
        from hetflow.infra.s3 import DEFAULT_DATASET_URL

        check_services(args.url or DEFAULT_DATASET_URL)  # a configured S3 answers, or one line
    where, found = find_datasets(args.url)
    if not found:
        print(
            f"no datasets under {args.url or 's3://'} in {where} "
            "(write one: hetflow data ingest --to s3://BUCKET/PREFIX)"
        )
        return 0
    n = f"{len(found)} dataset{'s' if len(found) > 1 else ''}"
    print(f"# {n} in {where} (train on one with --dataset-url URL)")
    for f in found:
        print(f.line())
    return 0


def cmd_stack(args) -> int:
    from hetflow import stack

    return {"up": stack.up, "down": stack.down, "status": stack.status}[args.action]()


def benchmark_module(name: str):
    """`benchmarks.NAME`, the installed benchmark (pyproject installs `benchmarks` with
    hetflow; `NAME` is one of `BENCHMARKS`); one line where an install made before it did
    leaves the package out."""
    try:
        return importlib.import_module(f"benchmarks.{name}")
    except ModuleNotFoundError as e:
        if e.name != "benchmarks":
            raise
        raise ConfigError(
            "hetflow bench: the package `benchmarks` is not installed; reinstall hetflow "
            "(`pip install -e .` in the checkout) to install it"
        ) from None


def cmd_bench(args) -> int:
    """Each benchmark module parses its own flags: `hetflow bench NAME --help`."""
    return benchmark_module(args.name).main(args.rest)


def cmd_simulate(args) -> int:
    """The simulator parses its own flags: `hetflow simulate --help`."""
    from hetflow.cli.simulate import main as simulate

    return simulate(args.rest)


def cmd_cluster_config(args) -> int:
    """The Ray cluster-launcher YAML for a cluster spec, checked by Ray's own schema."""

    import yaml

    from hetflow.config import ClusterSpec
    from hetflow.infra.catalog import Catalog
    from hetflow.infra.ray_cluster import CHECKOUT, ray_cluster_config, validate

    cluster = ClusterSpec.from_file(args.cluster_file)
    config = ray_cluster_config(
        cluster, Catalog.for_cluster(cluster), CHECKOUT, args.region, args.image_id
    )
    validate(config)
    text = yaml.safe_dump(config, sort_keys=False)
    if args.output:
        Path(args.output).write_text(text)
        nodes = {k: v["max_workers"] for k, v in config["available_node_types"].items()}
        print(f"wrote {args.output}: nodes {nodes}; bring it up with `ray up {args.output}`")
    else:
        print(text, end="")
    return 0
