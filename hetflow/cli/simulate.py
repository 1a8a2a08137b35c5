"""`hetflow simulate`: predict data-parallel training at 1 to 1024 workers (`hetflow.forecast`).

    hetflow simulate --mix g4dn.xlarge:32,g5.xlarge:16,p3dn.24xlarge:2 --model resnet50 \\
        --workers 1,4,16,64,256,1024 --json sim.json --plot sim.png
    hetflow simulate --cluster profile.json --workers 4,64,1024   # a measured profile, replicated
    hetflow simulate --published --json published.json             # fitted, then held-out error
    hetflow simulate --calibrate --json calibration.json           # predict real runs made here

Clusters: `--mix TYPE:COUNT,...` (EC2 instance types and instance counts; a GPU instance gives
one worker per GPU), `--cluster FILE` (a hetflow cluster file whose workers name instance
types, or a profile JSON written by `hetflow profile --json`). Instance types are described by
the EC2 API (infra.catalog; a local moto endpoint when no AWS endpoint or credentials are
configured) and priced from infra/prices.json. `--workers` scales the cluster, keeping its mix.

Compute of an instance type never measured: per-sample FLOPs / (FP32 peak x `--fraction`);
a profile's ranks bring their own fitted a + c x batch. See docs/benchmarks.md for the model,
`benchmarks.calibrate` for what `--calibrate` runs (it imports torch, so only when asked).
"""

from __future__ import annotations

import argparse
import math
import time
from collections import Counter
from functools import partial

from hetflow.cli.args import Parser
from hetflow.cli.errors import say_alias
from hetflow.config import MODEL_ALIASES, ClusterSpec, ConfigError, load_mapping
from hetflow.forecast.simulate import clusters, report
from hetflow.forecast.simulate.job import MAX_WORKERS, MODELS, Job, ModelSpec, Network
from hetflow.forecast.simulate.published import published_comparison
from hetflow.forecast.simulate.step import StepPrediction, sweep
from hetflow.output import write_json

DEFAULT_MIX = "g4dn.xlarge:32,g5.xlarge:16,p3dn.24xlarge:2"
DEFAULT_FRACTION = 0.3


# -- arguments --------------------------------------------------------------------------------


def parse_workers(text: str) -> list[int]:
    """`"1,4,16"` -> [1, 4, 16] (sorted, without repeats); a ConfigError naming --workers."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            n = int(part)
        except ValueError:
            raise ConfigError(
                f"--workers: expected whole numbers separated by commas (got {part!r})"
            ) from None
        if n < 1:
            raise ConfigError(f"--workers: every count must be >= 1 (got {n})")
        if n > MAX_WORKERS:
            raise ConfigError(f"--workers: at most {MAX_WORKERS} (got {n})")
        out.append(n)
    if not out:
        raise ConfigError("--workers: at least one count is needed")
    return sorted(set(out))


def parse_fraction(text: str) -> float | dict[str, float]:
    """`0.3` or `T4=0.15,A10G=0.2,*=0.3` (achieved share of FP32 peak, per GPU family)."""

    def number(v: str) -> float:
        try:
            f = float(v)
        except ValueError:
            f = math.nan
        if not (math.isfinite(f) and 0 < f <= 1):
            raise ConfigError(f"--fraction: each value must be in (0, 1] (got {v!r})")
        return f

    if "=" not in text:
        return number(text)
    out = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise ConfigError(
                f"--fraction: expected DEVICE=F pairs, e.g. T4=0.15,*=0.3 (got {part!r})"
            )
        out[key.strip()] = number(value)
    return out


def _add_network_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--collective", choices=["ring", "hierarchical"], default="ring")
    p.add_argument(
        "--alpha-us",
        type=float,
        dest="alpha_us",
        help="latency per ring hop between nodes, µs (default 25; a profile's own)",
    )
    p.add_argument("--intra-alpha-us", type=float, default=5.0, dest="intra_alpha_us")
    p.add_argument(
        "--link-gbps",
        type=float,
        dest="link_gbps",
        help="every worker's network share, Gbit/s (default: the catalog's or the profile's)",
    )
    p.add_argument(
        "--intra-gbps",
        type=float,
        dest="intra_gbps",
        help="intra-node bus bandwidth, Gbit/s (default by GPU family)",
    )
    p.add_argument(
        "--compression-ratio",
        type=float,
        default=1.0,
        dest="compression_ratio",
        help="gradient bytes / bytes sent (e.g. 2 for fp16; `hetflow bench comm` measures it)",
    )
    p.add_argument(
        "--average-every",
        type=int,
        default=1,
        dest="average_every",
        help="hierarchical: cross nodes every H steps (hetflow's hierarchical:H)",
    )
    p.add_argument(
        "--overlap",
        type=float,
        default=0.0,
        help="share of the slowest compute that communication hides behind (0..1, default 0)",
    )


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="hetflow simulate",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.HelpFormatter,  # its help states the defaults itself
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--mix", help=f"TYPE:COUNT,... EC2 instance types and counts (default {DEFAULT_MIX})"
    )
    src.add_argument("--cluster", help="cluster file (workers name instance types) or profile JSON")
    p.add_argument(
        "--model", help=f"{' | '.join(MODELS)} (default resnet50; a profile's own model)"
    )
    p.add_argument(
        "--workers", help="worker counts, e.g. 1,2,4,...,1024 (default: the cluster's size)"
    )
    batch = p.add_mutually_exclusive_group()
    batch.add_argument(
        "--local-batch",
        type=int,
        dest="local_batch",
        help="samples per worker per step (weak scaling; default per model)",
    )
    batch.add_argument(
        "--global-batch", type=int, dest="global_batch", help="samples per step (strong scaling)"
    )
    _add_network_args(p)
    p.add_argument(
        "--fraction",
        default=str(DEFAULT_FRACTION),
        help="achieved share of FP32 peak: 0.3, or per GPU family T4=0.15,A10G=0.2,*=0.3",
    )
    p.add_argument("--step-overhead-ms", type=float, default=0.0, dest="overhead_ms")
    p.add_argument(
        "--jitter", type=float, default=0.0, help="coefficient of variation of step compute"
    )
    p.add_argument(
        "--storage-mbps",
        type=float,
        dest="storage_mbps",
        help="each worker's read throughput from storage, Mbit/s (default: data local)",
    )
    p.add_argument(
        "--published",
        action="store_true",
        help="fit on some published throughput rows; report the error on the others",
    )
    p.add_argument(
        "--calibrate", action="store_true", help="run small real trainings here and predict them"
    )
    p.add_argument("--calibrate-steps", type=int, default=30, dest="calibrate_steps")
    p.add_argument("--json", dest="json_path")
    p.add_argument("--plot", dest="plot_path", help="PNG: efficiency against workers")
    return p


# -- building the simulation ------------------------------------------------------------------


def _catalog(types: list[str]):
    from hetflow.infra.catalog import Catalog
    from hetflow.infra.s3 import local_s3_endpoint

    with local_s3_endpoint(keep=False):
        return Catalog.for_types(types)


def _price_source(catalog) -> str:
    return f"{catalog.prices.source} (as of {catalog.prices.as_of})"


def _model(name: str | None, default: str = "resnet50") -> ModelSpec:
    name = name or default
    say_alias("--model", name, MODEL_ALIASES)
    name = MODEL_ALIASES.get(name, name)
    if name not in MODELS:
        raise ConfigError(f"--model: unknown model {name!r}; choose one of {', '.join(MODELS)}")
    return MODELS[name]


def _profile_source(args, data: dict):
    """(model, cluster_at, source, alpha_s) of a profile JSON; a flag's alpha wins."""
    profile = clusters.as_profile(data)
    model = _model(args.model, profile.model)
    base = clusters.profile_workers(profile)  # --link-gbps goes to the Network, which overrides
    alpha_s = clusters.profile_alpha_s(profile)
    source = {"profile": args.cluster, "ranks": len(base)}
    return model, partial(clusters.resized, base), source, alpha_s


def _file_source(args, data: dict, fraction):
    """(model, cluster_at, source) of a cluster file whose workers name instance types."""
    model = _model(args.model)
    cluster = ClusterSpec.model_validate(data)
    catalog = _catalog(clusters.spec_instance_types(cluster))
    base = clusters.spec_cluster(cluster, catalog, model, fraction, args.storage_mbps)
    kinds = Counter(w.instance_type for w in cluster.workers)
    source = {
        "cluster": cluster.name,
        "workers": dict(kinds),
        "price_source": _price_source(catalog),
    }
    return model, partial(clusters.resized, base), source


def _mix_source(args, fraction):
    """(model, cluster_at, source) of `--mix` (or the default mix)."""
    model = _model(args.model)
    mix = clusters.parse_mix(args.mix or DEFAULT_MIX)
    catalog = _catalog([t for t, _ in mix])

    def cluster_at(n: int | None = None):
        return clusters.catalog_cluster(
            mix, catalog, model, fraction, n, storage_mbps=args.storage_mbps
        )

    return model, cluster_at, {"mix": dict(mix), "price_source": _price_source(catalog)}


def _job(args, model: ModelSpec) -> Job:
    """Strong scaling with --global-batch; weak with --local-batch or the model's default local
    batch; else the model's default global batch."""
    kw = {"step_overhead_s": args.overhead_ms / 1e3, "jitter": args.jitter}
    if args.global_batch is not None:
        return Job(model, global_batch=args.global_batch, **kw)
    if args.local_batch is not None or model.default_local_batch is not None:
        return Job(model, local_batch=args.local_batch or model.default_local_batch, **kw)
    return Job(model, global_batch=model.default_global_batch, **kw)


def setup(args) -> dict:
    """The cluster (a function of n), the job, the network and a description, from the flags."""
    fraction = parse_fraction(args.fraction)
    storage = args.storage_mbps
    if storage is not None and not (math.isfinite(storage) and storage > 0):
        raise ConfigError(f"--storage-mbps: must be > 0 (got {storage})")
    alpha_s = None if args.alpha_us is None else args.alpha_us * 1e-6
    if alpha_s is not None and not (math.isfinite(alpha_s) and alpha_s >= 0):
        raise ConfigError(f"--alpha-us: must be >= 0 (got {args.alpha_us})")
    data = load_mapping(args.cluster) if args.cluster else None
    if data is not None and "ranks" in data:
        model, cluster_at, source, measured_alpha = _profile_source(args, data)
        alpha_s = measured_alpha if alpha_s is None else alpha_s
    elif data is not None:
        model, cluster_at, source = _file_source(args, data, fraction)
    else:
        model, cluster_at, source = _mix_source(args, fraction)
    network = Network(
        collective=args.collective,
        alpha_s=25e-6 if alpha_s is None else alpha_s,
        intra_alpha_s=args.intra_alpha_us * 1e-6,
        intra_gbps=args.intra_gbps,
        link_gbps=args.link_gbps,
        compression_ratio=args.compression_ratio,
        overlap=args.overlap,
        average_every=args.average_every,
    )
    own = len(cluster_at(None))
    counts = parse_workers(args.workers) if args.workers else [own]
    return {
        "cluster_at": cluster_at,
        "job": _job(args, model),
        "network": network,
        "counts": counts,
        "source": source,
        "fraction": fraction,
        "model": model,
    }


# -- running it -------------------------------------------------------------------------------


def _rows(preds: list[StepPrediction]) -> list[dict]:
    """The predictions as JSON rows, each with its local batch range and its speedup over the
    baseline plan at the same worker count."""
    rows = []
    base_tp = {}
    for p in preds:
        row = p.row()
        row["local_batch_min"], row["local_batch_max"] = min(p.local_batches), max(p.local_batches)
        if p.plan == "baseline":
            base_tp[p.workers] = p.throughput_samples_per_s
        rows.append(row)
    for row in rows:
        b = base_tp.get(row["workers"])
        row["speedup_vs_baseline"] = row["throughput_samples_per_s"] / b if b else None
    return rows


def run_simulation(s: dict) -> dict:
    """Both plans at every worker count of `setup`'s answer, as `hetflow simulate --json`
    reports them, with the time each count took to simulate."""
    preds: list[StepPrediction] = []
    per_count: dict[int, float] = {}
    for n in s["counts"]:  # timed per count: one answer (both plans, cluster built) at n workers
        t = time.perf_counter()
        preds += sweep(s["cluster_at"], [n], s["job"], s["network"])
        per_count[n] = time.perf_counter() - t
    biggest = max(s["counts"])
    kinds = dict(Counter(w.kind for w in s["cluster_at"](biggest)))
    job, net, model = s["job"], s["network"], s["model"]
    return {
        "rows": _rows(preds),
        "model": {
            "name": model.name,
            "params": model.params,
            "per_sample_gflop": model.per_sample_flops / 1e9,
            "epoch_samples": model.epoch_samples,
            "gradient_mb": model.grad_bytes / 1e6,
        },
        "cluster": {**s["source"], f"workers_at_{biggest}": kinds},
        "job": {
            "global_batch": job.global_batch,
            "local_batch": job.local_batch,
            "step_overhead_s": job.step_overhead_s,
            "jitter": job.jitter,
        },
        "network": {
            "collective": net.collective,
            "alpha_us": net.alpha_s * 1e6,
            "intra_alpha_us": net.intra_alpha_s * 1e6,
            "link_gbps": net.link_gbps,
            "intra_gbps": net.intra_gbps,
            "compression_ratio": net.compression_ratio,
            "overlap": net.overlap,
            "buckets_per_step": net.buckets(model.grad_bytes / net.compression_ratio),
        },
        "achieved_fraction": s["fraction"],
        "simulate_s": sum(per_count.values()),
        "simulate_s_by_workers": per_count,
    }


def main(argv: list[str] | None = None) -> int:
    """`hetflow simulate` with these flags; writes --json / --plot if given, returns 0."""
    if argv and argv[0] == "--":  # `hetflow simulate -- --flags`: argparse's REMAINDER keeps "--"
        argv = argv[1:]
    args = build_parser().parse_args(argv)
    out: dict = {}
    if args.calibrate:
        from benchmarks.calibrate import calibrate  # installed with hetflow; it imports torch

        cal = calibrate(args.calibrate_steps)
        report.print_calibration(cal)
        out["calibration"] = cal
    explicit = any(v is not None for v in (args.mix, args.cluster, args.workers, args.model))
    if args.published:
        pub = published_comparison()
        report.print_published(pub)
        out["published"] = pub
    if explicit or not (args.calibrate or args.published):
        res = run_simulation(setup(args))
        report.print_rows(res)
        out.update(res)
    if args.plot_path:
        if "rows" not in out and "published" not in out:
            raise ConfigError("--plot: nothing to plot (calibration alone has no efficiency curve)")
        report.plot(out, args.plot_path)
        print(f"wrote {args.plot_path}")
    write_json(args.json_path, out)
    return 0
