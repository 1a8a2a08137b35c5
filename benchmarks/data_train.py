"""`hetflow bench data --train`: streaming measured inside real training runs (torchrun ranks).

    hetflow bench data --train --s3-latency-ms 80 --json stream.json

One invocation, synthetic digits-shaped datasets in S3 (moto in a process of its own), the
ranks of a cluster training the CNN with torchrun; every figure comes from the runs'
own records (`StepRecord.data_s`, `StepRecord.s3_bytes`, `RankResult.cache`,
`RankResult.peak_rss_bytes`). Two parts:

- **wait**: `--epochs` epochs of a dataset whose share fits the host's cache, S3 at
  `--s3-latency-ms` per GET; variants `prefetch` (the reader `--prefetch` shards ahead) and
  `no_prefetch`, each with a cold cache. Per epoch: `data_wait_fraction` (the ranks' data wait
  over their step time), `s3_bytes_read`, `cache_hit_ratio` (whole run).
- **memory**: the same job on a dataset of `--memory-scale` x the cache budget
  (`--memory-cache-mb`), and on one of a single shard (`tiny`): each rank's peak resident
  memory. The fixed margin is the tiny run's peak less its model state; the bound checked is
  margin + cache budget + (prefetch + 2) decoded shards + model state; per rank, that with the
  rank's own fixed part (`start_rss_bytes`, its peak before it opened the data) and the tiny
  run's largest growth over its start as the margin; and the first plus the peak
  of the sample index (O(shards x classes) and the within-block permutations in use, no table
  per sample: measured here with tracemalloc). Then rank 0's reader alone, in a process
  without torch, over the large dataset: its peak resident memory before and after an epoch.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

from hetflow.cli.args import Parser
from hetflow.config import ClusterSpec, ConfigError, DatasetSpec, TrainConfig
from hetflow.infra.data.format import Manifest, synthetic_source, write_dataset
from hetflow.records import Plan, RunResult
from hetflow.training.launch.run import run_plan

from benchmarks import wide_console, write_json
from benchmarks.s3_endpoint import s3_endpoint

SAMPLE_BYTES = 64 * 4 + 8  # a decoded sample: 64 float32 features and an int64 label


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = Parser(prog="hetflow bench data --train", description=__doc__.splitlines()[0])
    p.add_argument("--s3-latency-ms", type=float, default=80.0, help="emulated latency per GET")
    p.add_argument("--ranks", type=int, default=2, help="torchrun ranks (emulated workers)")
    p.add_argument("--epochs", type=int, default=3, help="epochs of the wait part")
    p.add_argument("--steps-per-epoch", type=int, default=40)
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--shard-samples", type=int, default=256)
    p.add_argument("--prefetch", type=int, default=4, help="shards each rank reads ahead")
    p.add_argument("--cache-mb", type=float, default=64.0, help="cache budget of the wait part")
    p.add_argument("--memory-cache-mb", type=float, default=8.0, help="of the memory part")
    p.add_argument("--memory-scale", type=float, default=10.0, help="dataset / cache budget")
    p.add_argument("--memory-shard-samples", type=int, default=2048)
    p.add_argument("--memory-batch", type=int, default=512, help="global batch of that part")
    p.add_argument("--parts", default="wait,memory", help="subset, comma-separated")
    p.add_argument("--json", dest="json_path", help="write the results here")
    a = p.parse_args(argv)
    a.parts = [s for s in a.parts.split(",") if s]
    checks = {
        "--ranks": a.ranks >= 1,
        "--epochs": a.epochs >= 2,
        "--steps-per-epoch": a.steps_per_epoch >= 1,
        "--global-batch": a.global_batch >= a.ranks,
        "--shard-samples": a.shard_samples >= 1,
        "--prefetch": a.prefetch >= 0,
        "--cache-mb": a.cache_mb > 0,
        "--memory-cache-mb": a.memory_cache_mb > 0,
        "--memory-scale": a.memory_scale >= 1,
        "--memory-shard-samples": a.memory_shard_samples >= 1,
        "--memory-batch": a.memory_batch >= a.ranks,
        "--parts": bool(a.parts) and set(a.parts) <= {"wait", "memory"},
    }
    for flag, ok in checks.items():
        if not ok:
            raise ConfigError(f"{flag}: invalid value {getattr(a, flag[2:].replace('-', '_'))!r}")
    return a


def dataset(url: str, train_samples: int, shard_samples: int) -> Manifest:
    """`train_samples` train samples and a tenth as many test samples, in shards."""
    n_test = max(1, train_samples // 10)
    x, y = synthetic_source(train_samples + n_test + 1, 1e-9, 0)["train"]
    splits = {"train": (x[n_test:], y[n_test:]), "test": (x[:n_test], y[:n_test])}
    return write_dataset(url, splits, shard_samples)


def train_run(
    name: str, data: DatasetSpec, a: argparse.Namespace, steps: int, batch: int, tmp: str
) -> RunResult:
    """One training run of the CNN on `a.ranks` equal workers, with a cold cache: emulated as
    `hetflow train` emulates them (time scale 8) when the run measures time, not emulated
    (faster) when it measures memory."""
    train = TrainConfig(
        recipe="digits-cnn",
        global_batch=batch,
        steps=steps,
        schedule="equal",
        eval_every=steps,
        checkpoint_every=steps + 1,
        target_accuracy=None,
    )
    share = [batch // a.ranks] * a.ranks
    share[-1] += batch - sum(share)
    cluster = ClusterSpec.from_speeds([1.0] * a.ranks, emulate=not name.startswith("mem"))
    dataset = data.model_copy(update={"cache_dir": f"{tmp}/{name}/cache"})
    run_dir = f"{tmp}/{name}/{name}"
    return run_plan(
        cluster, Plan.equal(share), train, dataset, run_dir, variant=name, timeout_s=1200
    ).result


def epoch_figures(result: RunResult, steps_per_epoch: int) -> list[dict]:
    """Per epoch (pure): the ranks' data wait over their step time, and the S3 bytes read."""
    out = []
    steps = len(result.ranks[0].records)
    for start in range(0, steps, steps_per_epoch):
        recs = [rec for r in result.ranks for rec in r.records[start : start + steps_per_epoch]]
        out.append(
            {
                "data_wait_fraction": sum(x.data_s for x in recs) / sum(x.step_s for x in recs),
                "s3_bytes_read": sum(x.s3_bytes for x in recs),
                "step_s": sum(x.step_s for x in recs) / len(recs),
            }
        )
    return out


def run_wait(a: argparse.Namespace, tmp: str) -> dict:
    n = a.steps_per_epoch * a.global_batch
    url = f"s3://hetflow-bench/stream-{n}-{a.shard_samples}"
    m = dataset(url, n, a.shard_samples)
    out: dict = {"dataset_bytes": sum(s.bytes for s in m.splits["train"].shards), "variants": {}}
    for name, depth in (("prefetch", a.prefetch), ("no_prefetch", 0)):
        spec = DatasetSpec(
            url=url, cache_mb=a.cache_mb, prefetch=depth, s3_latency_ms=a.s3_latency_ms
        )
        res = train_run(name, spec, a, a.epochs * a.steps_per_epoch, a.global_batch, tmp)
        hits = sum(r.cache.hits for r in res.ranks)
        misses = sum(r.cache.misses for r in res.ranks)
        out["variants"][name] = {
            "prefetch": depth,
            "epochs": epoch_figures(res, a.steps_per_epoch),
            "cache_hit_ratio": hits / (hits + misses),
        }
    return out


def run_memory(a: argparse.Namespace, tmp: str) -> dict:
    """One epoch of a dataset `memory_scale` x the cache budget, and as many steps on a
    one-shard dataset: the ranks' peak resident memory (S3 latency off: it does not change
    what is held)."""
    budget, shard = int(a.memory_cache_mb * 1e6), a.memory_shard_samples
    n = int(a.memory_scale * budget / SAMPLE_BYTES)
    steps = max(1, n // a.memory_batch)
    out: dict = {"cache_budget_bytes": budget, "decoded_shard_bytes": shard * SAMPLE_BYTES}
    out["runs"] = {}
    for name, samples in (("tiny", shard), ("large", n)):
        url = f"s3://hetflow-bench/stream-mem-{samples}-{shard}"
        m = dataset(url, samples, shard)
        spec = DatasetSpec(url=url, cache_mb=a.memory_cache_mb, prefetch=a.prefetch)
        res = train_run(f"mem-{name}", spec, a, steps, a.memory_batch, tmp)
        out["runs"][name] = {
            "dataset_bytes": sum(s.bytes for sp in m.splits.values() for s in sp.shards),
            "steps": steps,
            "peak_rss_bytes": [r.peak_rss_bytes for r in res.ranks],
            "start_rss_bytes": [r.start_rss_bytes for r in res.ranks],
            "s3_bytes_read": sum(r.cache.bytes_read for r in res.ranks),
            "model_state_bytes": 3 * 4 * res.ranks[0].params,  # weights, grads, momentum
        }
    tiny, large = out["runs"]["tiny"], out["runs"]["large"]
    margin = max(tiny["peak_rss_bytes"]) - tiny["model_state_bytes"]
    out["margin_bytes"] = margin
    held = (a.prefetch + 2) * out["decoded_shard_bytes"]
    out["bound_bytes"] = margin + budget + held + large["model_state_bytes"]
    out["index_peak_bytes"] = index_peak_bytes(m, a.memory_batch, steps)
    out["large_minus_tiny_bytes"] = max(large["peak_rss_bytes"]) - max(tiny["peak_rss_bytes"])
    # The same bound per rank, its fixed part its own: each rank's peak before it opened the
    # data (torch, gloo: up to 17 MB apart between ranks and runs) plus a training margin, the
    # tiny run's largest growth over its own start less its model state.
    grown = [p - s for p, s in zip(tiny["peak_rss_bytes"], tiny["start_rss_bytes"], strict=True)]
    out["training_margin_bytes"] = max(grown) - tiny["model_state_bytes"]
    room = out["training_margin_bytes"] + budget + held + large["model_state_bytes"]
    out["rank_bound_bytes"] = [s + room for s in large["start_rss_bytes"]]
    out["reader_alone"] = reader_peak(m.url, budget, a.prefetch, a.memory_batch, a.ranks)
    return out


READER_PEAK = """
import json, re, sys, tempfile
from pathlib import Path
from hetflow.infra.data.cache import ShardCache
from hetflow.infra.data.format import read_manifest
from hetflow.infra.data.reader import RankReader
url, budget, prefetch, batch, ranks = sys.argv[1], *map(int, sys.argv[2:])
# This process's own peak (VmHWM): getrusage's would be at least the parent's size at fork.
status = Path("/proc/self/status")
peak = lambda: int(re.search(r"VmHWM:\\s+(\\d+) kB", status.read_text()).group(1)) * 1024
m = read_manifest(url)
plan = [batch // ranks] * ranks
plan[-1] += batch - sum(plan)
steps = m.splits["train"].samples // batch + 10
with tempfile.TemporaryDirectory() as d:
    cache = ShardCache(url, d, budget_bytes=budget, prefetch_depth=1)
    with RankReader(m, "train", cache, 0, 1, prefetch=prefetch) as r:
        for t in range(3):
            r.batch(t, plan)
    before = peak()
    with RankReader(m, "train", cache, 0, 0, prefetch=prefetch) as r:
        for t in range(steps):
            r.batch(t, plan)
print(json.dumps({"steps": steps, "peak_before_bytes": before, "peak_after_bytes": peak()}))
"""


def reader_peak(url: str, budget: int, prefetch: int, batch: int, ranks: int) -> dict:
    """Rank 0's reader alone, in a process of its own without torch (Linux: /proc's VmHWM): its
    peak resident memory after 3 steps of a first reader (imports, threads, the first shards)
    and after a second reader's epoch and 10 steps through a cache of `budget` bytes, cold but
    for the first reader's shards (`growth_bytes`: the data path's own, with none of a
    training rank's other memory to blur it)."""
    args = [sys.executable, "-c", READER_PEAK, url, str(budget), str(prefetch), str(batch)]
    done = subprocess.run([*args, str(ranks)], capture_output=True, text=True, check=True)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["growth_bytes"] = out["peak_after_bytes"] - out["peak_before_bytes"]
    return out


def index_peak_bytes(manifest: Manifest, batch: int, steps: int) -> int:
    """Peak bytes of rank 0's sample index over the run's steps (the numbering of the samples,
    the epoch orders, the shard schedule and the prefetch's next shards), measured with
    tracemalloc as `RankReader.batch` plans each step, reading nothing: the part of a rank's
    memory that could grow with the number of samples (not their size). It is O(shards x
    classes) plus the within-block permutations in use (infra/data/partition.py)."""
    import tracemalloc

    from hetflow.infra.data.reader import RankReader

    RankReader(manifest, "train", None, 0, 0).needed(0, [batch])  # imports, first calls
    tracemalloc.start()
    reader = RankReader(manifest, "train", None, 0, 0)  # plans, reads nothing
    for t in range(steps + 1):
        reader.needed(t, [batch])
        reader.upcoming(t, [batch], 4)
        reader.stream.index.shard_of(reader.stream.step_indices(t, [batch], 0))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return int(peak)


def goals(out: dict) -> dict:
    g: dict = {}
    wait = out.get("wait")
    if wait:
        later = wait["variants"]["prefetch"]["epochs"][1:]
        g["prefetch_wait_below_5pct_after_epoch_1"] = all(
            e["data_wait_fraction"] < 0.05 for e in later
        )
        g["zero_s3_bytes_after_epoch_1"] = all(
            e["s3_bytes_read"] == 0 for v in wait["variants"].values() for e in v["epochs"][1:]
        )
    mem = out.get("memory")
    if mem:
        peak = max(mem["runs"]["large"]["peak_rss_bytes"])
        g["large_dataset_peak_rss_within_budget_prefetch_model_margin"] = peak <= mem["bound_bytes"]
        g["large_dataset_peak_rss_within_that_plus_sample_index"] = (
            peak <= mem["bound_bytes"] + mem["index_peak_bytes"]
        )
        peaks, bounds = mem["runs"]["large"]["peak_rss_bytes"], mem["rank_bound_bytes"]
        g["each_rank_within_its_start_plus_margin_budget_prefetch_model"] = all(
            p <= b for p, b in zip(peaks, bounds, strict=True)
        )
    return g


def print_report(out: dict) -> None:
    from rich.table import Table

    console = wide_console(110)
    c = out["config"]
    if "wait" in out:
        t = Table(title=f"streaming in training: {c['ranks']} ranks, S3 {c['s3_latency_ms']:g} ms")
        for col in ("variant", "epoch", "data wait", "S3 MB read", "step ms"):
            t.add_column(col, justify="left" if col == "variant" else "right")
        for name, v in out["wait"]["variants"].items():
            for i, e in enumerate(v["epochs"]):
                t.add_row(
                    name if i == 0 else "",
                    str(i + 1),
                    f"{e['data_wait_fraction']:.1%}",
                    f"{e['s3_bytes_read'] / 1e6:.3f}",
                    f"{e['step_s'] * 1e3:.1f}",
                )
        console.print(t)
    if "memory" in out:
        mem = out["memory"]
        for name, r in mem["runs"].items():
            console.print(
                f"{name}: dataset {r['dataset_bytes'] / 1e6:.1f} MB, peak RSS per rank "
                f"{', '.join(f'{b / 1e6:.0f}' for b in r['peak_rss_bytes'])} MB, "
                f"S3 read {r['s3_bytes_read'] / 1e6:.1f} MB"
            )
        console.print(
            f"cache budget {mem['cache_budget_bytes'] / 1e6:.1f} MB; margin "
            f"{mem['margin_bytes'] / 1e6:.0f} MB; bound {mem['bound_bytes'] / 1e6:.0f} MB; "
            f"large - tiny peak {mem['large_minus_tiny_bytes'] / 1e6:.1f} MB; sample index "
            f"{mem['index_peak_bytes'] / 1e6:.1f} MB at its peak"
        )
        large = mem["runs"]["large"]
        console.print(
            f"per rank: start {', '.join(f'{b / 1e6:.0f}' for b in large['start_rss_bytes'])} MB; "
            f"training margin {mem['training_margin_bytes'] / 1e6:.1f} MB; peak - bound "
            + ", ".join(
                f"{(p - b) / 1e6:+.1f}"
                for p, b in zip(large["peak_rss_bytes"], mem["rank_bound_bytes"], strict=True)
            )
            + " MB"
        )
        alone = mem["reader_alone"]
        console.print(
            f"rank 0's reader alone: peak RSS {alone['peak_before_bytes'] / 1e6:.1f} MB after "
            f"3 steps, {alone['peak_after_bytes'] / 1e6:.1f} MB after {alone['steps']} "
            f"(+{alone['growth_bytes'] / 1e6:.1f} MB)"
        )
    console.print(f"took {out['wall_s']:.0f}s")
    for k, ok in out["goals"].items():
        console.print(f"  {'yes' if ok else 'NO '}  {k}")


def main(argv: list[str] | None = None) -> int:
    try:
        a = parse_args(list(argv or []))
    except ConfigError as e:
        print(f"hetflow bench data --train: error: {e}")
        return 2
    started = time.perf_counter()
    out: dict = {"config": {k: v for k, v in vars(a).items() if k != "json_path"}}
    with s3_endpoint(False), tempfile.TemporaryDirectory(prefix="hetflow-bench-stream-") as tmp:
        if "wait" in a.parts:
            out["wait"] = run_wait(a, tmp)
        if "memory" in a.parts:
            out["memory"] = run_memory(a, tmp)
    out["wall_s"] = time.perf_counter() - started
    out["goals"] = goals(out)
    print_report(out)
    write_json(a.json_path, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
