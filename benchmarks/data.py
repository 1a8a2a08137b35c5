"""`hetflow bench data`: no cache vs cache vs cache + prefetch, reading S3 shard by shard.

    hetflow bench data --s3-latency-ms 50 --s3-mbps 400 --epochs 3 --json data.json
    hetflow bench data --train --s3-latency-ms 80   # inside training runs (data_train.py)

One invocation, one synthetic dataset in S3 (moto on loopback unless AWS_ENDPOINT_URL is set),
one rank of a plan (default rank 0 of 32,32,64) read with `infra.data.reader.RankReader` in the
shard-local stream order. A training-like loop per variant: each step waits for the rank's
samples, then "computes" for a fixed time (sleep, so that a background reader can overlap it).
Variants, each with a cold cache directory of its own:

- `no_cache`: every shard read goes to S3;
- `cache`: through the local cache (`--cache-mb`), no prefetch;
- `cache_prefetch`: the same, plus the background reader `--prefetch` shards ahead;
- `cache_half`: no prefetch, a budget of half the rank's share (the LRU under pressure).

Per epoch: `s3_bytes_read`, `cache_hit_ratio` (the loop's reads served by the cache),
`data_wait_fraction` (time waiting for data / step time), and for variants without prefetch the
bytes a model of the same read sequence predicts (`expected_bytes`: every read for `no_cache`,
an exact byte-budget LRU for the others). S3's latency
and bandwidth are emulated (hetflow.emulation.store.EmulatedStore). Timings are wall-clock on a
shared host.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import OrderedDict

from hetflow.cli.args import Parser
from hetflow.config import ConfigError
from hetflow.infra.data.cache import ShardCache
from hetflow.infra.data.format import Manifest, synthetic_source, write_dataset
from hetflow.infra.data.partition import check_plan
from hetflow.infra.data.reader import RankReader, shard_reads

from benchmarks import wide_console, write_json
from benchmarks.s3_endpoint import s3_endpoint

VARIANTS = ("no_cache", "cache", "cache_prefetch", "cache_half")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = Parser(
        prog="hetflow bench data",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.HelpFormatter,  # its help states the defaults itself
    )
    p.add_argument("--s3-latency-ms", type=float, default=50.0, help="emulated latency per GET")
    p.add_argument("--s3-mbps", type=float, default=400.0, help="emulated bandwidth; 0: unlimited")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument(
        "--cache-mb", type=float, default=64.0, help="budget of `cache`/`cache_prefetch`"
    )
    p.add_argument("--prefetch", type=int, default=4, help="shards read ahead in `cache_prefetch`")
    p.add_argument("--compute-ms", type=float, default=20.0, help="emulated compute per step")
    p.add_argument("--steps-per-epoch", type=int, default=50)
    p.add_argument("--shard-samples", type=int, default=200)
    p.add_argument("--plan", default="32,32,64", help="local batches of the ranks")
    p.add_argument("--rank", type=int, default=0, help="the rank whose share is read")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variants", default=",".join(VARIANTS), help="subset, comma-separated")
    p.add_argument(
        "--in-process-s3",
        action="store_true",
        help="serve moto from a thread of this process (default: its own process)",
    )
    p.add_argument("--json", dest="json_path", help="write the results here")
    a = p.parse_args(argv)
    try:
        a.plan = [int(b) for b in a.plan.split(",") if b.strip()]
    except ValueError:
        raise ConfigError(
            f"--plan: expected local batches separated by commas (got {a.plan!r})"
        ) from None
    a.variants = [v for v in a.variants.split(",") if v]
    checks = {
        "--epochs": a.epochs >= 1,
        "--steps-per-epoch": a.steps_per_epoch >= 1,
        "--shard-samples": a.shard_samples >= 1,
        "--cache-mb": a.cache_mb > 0,
        "--prefetch": a.prefetch >= 0,
        "--s3-latency-ms": a.s3_latency_ms >= 0,
        "--s3-mbps": a.s3_mbps >= 0,
        "--compute-ms": a.compute_ms >= 0,
        "--rank": 0 <= a.rank < len(a.plan),
        "--variants": bool(a.variants) and set(a.variants) <= set(VARIANTS),
    }
    for flag, ok in checks.items():
        if not ok:
            raise ConfigError(f"{flag}: invalid value {getattr(a, flag[2:].replace('-', '_'))!r}")
    return a


def simulate_lru(reads: list[list[int]], sizes: list[int], budget: int) -> list[int]:
    """Bytes fetched per step by a byte-budget LRU that always keeps the entry just read."""
    lru: OrderedDict[int, int] = OrderedDict()
    total, out = 0, []
    for step_reads in reads:
        fetched = 0
        for s in step_reads:
            if s in lru:
                lru.move_to_end(s)
                continue
            fetched += sizes[s]
            lru[s] = sizes[s]
            total += sizes[s]
            for old in list(lru):
                if total <= budget:
                    break
                if old != s:
                    total -= lru.pop(old)
        out.append(fetched)
    return out


def run_variant(
    manifest: Manifest, a: argparse.Namespace, budget: int, depth: int, directory: str
) -> list[dict]:
    cache = ShardCache(
        manifest.url, directory, budget, latency_s=a.s3_latency_ms / 1e3, mbps=a.s3_mbps or None
    )
    reader = RankReader(manifest, "train", cache, a.rank, a.seed, prefetch=depth)
    compute_s = a.compute_ms / 1e3
    epochs = []
    try:
        for e in range(a.epochs):
            before = cache.stats.snapshot()
            wait = compute = 0.0
            first_wait = None
            for step in range(e * a.steps_per_epoch, (e + 1) * a.steps_per_epoch):
                t0 = time.perf_counter()
                x, _ = reader.batch(step, a.plan)
                t1 = time.perf_counter()
                time.sleep(compute_s)  # the emulated forward/backward/all-reduce
                compute += time.perf_counter() - t1
                wait += t1 - t0
                first_wait = t1 - t0 if first_wait is None else first_wait
                assert len(x) == a.plan[a.rank]
            # The run's first step waits for a cold client and its first shards: nothing ran
            # before it that a prefetch could overlap. Reported, and left out of `_warm`.
            cold = first_wait if e == 0 else 0.0
            after = cache.stats.snapshot()
            hits, misses = after["hits"] - before["hits"], after["misses"] - before["misses"]
            epochs.append(
                {
                    "s3_bytes_read": after["bytes_read"] - before["bytes_read"],
                    "cache_hit_ratio": hits / (hits + misses) if hits + misses else 0.0,
                    "data_wait_fraction": wait / (wait + compute) if wait + compute else 0.0,
                    "data_wait_fraction_warm": (wait - cold) / (wait - cold + compute)
                    if compute
                    else 0.0,
                    "data_wait_s": wait,
                    "first_step_wait_s": first_wait,
                    "step_s": (wait + compute) / a.steps_per_epoch,
                    "hits": hits,
                    "misses": misses,
                    "prefetched": after["prefetched"] - before["prefetched"],
                    "evictions": after["evictions"] - before["evictions"],
                }
            )
    finally:
        reader.close()
        cache.close()
    return epochs


def goals(out: dict) -> dict:
    """The issue's goals, checked on this run's numbers (None: the variant was not run)."""
    v, share = out["variants"], out["share_bytes"]
    g: dict = {}
    if "cache" in v and v["cache"]["budget_bytes"] >= share and len(v["cache"]["epochs"]) > 1:
        g["cache_later_epochs_read_0_bytes"] = all(
            ep["s3_bytes_read"] == 0 for ep in v["cache"]["epochs"][1:]
        )
    if "cache_half" in v and len(v["cache_half"]["epochs"]) > 1:
        half = v["cache_half"]
        later = half["epochs"][1:]
        g["cache_half_reads_within_lru_bound"] = all(
            share - half["budget_bytes"] <= ep["s3_bytes_read"] <= share for ep in later
        )
        g["cache_half_reads_equal_lru_model"] = all(
            ep["s3_bytes_read"] == ep["expected_bytes"] for ep in half["epochs"]
        )
    if "cache_prefetch" in v:
        g["cache_prefetch_wait_below_5pct_after_first_step"] = all(
            ep["data_wait_fraction_warm"] < 0.05 for ep in v["cache_prefetch"]["epochs"]
        )
    if "no_cache" in v:
        g["no_cache_wait_above_50pct"] = all(
            ep["data_wait_fraction"] > 0.5 for ep in v["no_cache"]["epochs"]
        )
    return g


def print_table(out: dict) -> None:
    from rich.table import Table

    c = out["config"]
    t = Table(
        title=f"hetflow bench data: rank {c['rank']} of plan {c['plan']}, "
        f"S3 {c['s3_latency_ms']:g} ms + {c['s3_mbps'] or 'inf'} Mbit/s, "
        f"compute {c['compute_ms']:g} ms/step"
    )
    for col in (
        "variant",
        "budget MB",
        "epoch",
        "S3 MB read",
        "model MB",
        "hit ratio",
        "data wait",
        "wait w/o 1st step",
        "step ms",
    ):
        t.add_column(col, justify="left" if col == "variant" else "right")
    for name, var in out["variants"].items():
        for i, ep in enumerate(var["epochs"]):
            lru = ep.get("expected_bytes")
            t.add_row(
                name if i == 0 else "",
                f"{var['budget_bytes'] / 1e6:.2f}" if i == 0 else "",
                str(i + 1),
                f"{ep['s3_bytes_read'] / 1e6:.3f}",
                "-" if lru is None else f"{lru / 1e6:.3f}",
                f"{ep['cache_hit_ratio']:.2f}",
                f"{ep['data_wait_fraction']:.1%}",
                f"{ep['data_wait_fraction_warm']:.1%}",
                f"{ep['step_s'] * 1e3:.1f}",
            )
    console = wide_console(110)
    console.print(t)
    console.print(
        f"share of rank {c['rank']}: {out['share_bytes'] / 1e6:.3f} MB in "
        f"{out['share_shards']} of {out['shards']} shards; took {out['wall_s']:.1f}s"
    )
    for k, ok in out["goals"].items():
        console.print(f"  {'yes' if ok else 'NO '}  {k}")


def main(argv: list[str] | None = None) -> int:
    if "--train" in (argv or []):  # streaming inside real training runs: benchmarks/data_train.py
        from benchmarks import data_train

        return data_train.main([x for x in argv if x != "--train"])
    try:
        a = parse_args(list(argv or []))
        check_plan(a.steps_per_epoch * sum(a.plan), a.plan, "bench dataset")
    except (ConfigError, ValueError) as e:
        print(f"hetflow bench data: error: {e}")
        return 2
    started = time.perf_counter()
    n = a.steps_per_epoch * sum(a.plan)
    x, y = synthetic_source(n + 1, 1e-9, a.seed)["train"]  # exactly n train samples
    url = f"s3://hetflow-bench/data-{n}-{a.shard_samples}-{a.seed}"
    out: dict = {"config": {k: v for k, v in vars(a).items() if k != "json_path"}}
    with (
        s3_endpoint(a.in_process_s3),
        tempfile.TemporaryDirectory(prefix="hetflow-bench-data-") as tmp,
    ):
        manifest = write_dataset(url, {"train": (x, y)}, a.shard_samples)
        sizes = [s.bytes for s in manifest.splits["train"].shards]
        probe = RankReader(manifest, "train", None, a.rank, a.seed)  # plans reads, reads nothing
        steps = range(a.epochs * a.steps_per_epoch)
        reads = shard_reads(probe, steps, a.plan)
        share = sorted({s for r in reads[: a.steps_per_epoch] for s in r})
        out.update(
            shards=len(sizes),
            share_shards=len(share),
            share_bytes=sum(sizes[s] for s in share),
            variants={},
        )
        budgets = {
            "no_cache": (0, 0),
            "cache": (int(a.cache_mb * 1e6), 0),
            "cache_prefetch": (int(a.cache_mb * 1e6), a.prefetch),
            "cache_half": (out["share_bytes"] // 2, 0),
        }
        for name in a.variants:
            budget, depth = budgets[name]
            epochs = run_variant(manifest, a, budget, depth, f"{tmp}/{name}")
            if depth == 0:
                model = (
                    simulate_lru(reads, sizes, budget)
                    if budget
                    else [sum(sizes[s] for s in r) for r in reads]
                )
                for e, ep in enumerate(epochs):
                    ep["expected_bytes"] = sum(
                        model[e * a.steps_per_epoch : (e + 1) * a.steps_per_epoch]
                    )
            out["variants"][name] = {"budget_bytes": budget, "prefetch": depth, "epochs": epochs}
    out["wall_s"] = time.perf_counter() - started
    out["goals"] = goals(out)
    print_table(out)
    write_json(a.json_path, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
