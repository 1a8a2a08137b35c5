"""The simulator beside published multi-GPU training throughput, fitted on some rows and
judged on the others.

Every figure in `TABLES` is copied from the source named in its table (a repository file at a
commit). Per table, the first row fits the device's per-sample time; `alpha_s` (one latency per
ring hop per bucket) is fitted on the single-node tables' middle rows, and a multi-node table's
per-node link on its 4-node row. The remaining rows are held out: their error is the
simulator's prediction error. `published_comparison` computes it; the figures are in
docs/measurements/simulator.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hetflow.forecast.simulate.job import INTRA_NODE_GBPS, MODELS, Job, Network, WorkerModel
from hetflow.forecast.simulate.step import StepPrediction, simulate_step

_DLE = "https://github.com/NVIDIA/DeepLearningExamples/blob"
RESNET_README = (
    f"{_DLE}/291f0d02e815b148fa5c2b81bf07aa3552142895/"
    "PyTorch/Classification/ConvNets/resnet50v1.5/README.md"
)
RESNET_CONFIGS = (
    f"{_DLE}/097c7ff917b7c56246590b1246a8f5bd8957c534/PyTorch/Classification/ConvNets/configs.yml"
)
BERT_README = (
    f"{_DLE}/23a6382cbe8f77c22b0a7b7d263191ee6b947dfa/PyTorch/LanguageModeling/BERT/README.md"
)

FIT_C = "c"  # the row that fits the table's per-sample time
FIT_ALPHA = "alpha"  # a row that fits alpha_s (pooled over tables)
FIT_LINK = "link"  # the row that fits a multi-node table's per-node link
HELD_OUT = "held out"
ROLES = (FIT_C, FIT_ALPHA, FIT_LINK, HELD_OUT)


@dataclass(frozen=True)
class PublishedTable:
    """One published table: throughput (samples/s, whole job) by GPU count, as its source has it.

    `rows` maps GPUs to throughput; `gpus_per_node` GPUs share a node (one node when it is at
    least the largest count). Mixed precision all-reduces fp16 gradients (half the bytes).
    """

    key: str
    title: str
    model: str
    device: str
    precision: str
    local_batch: int
    gpus_per_node: int
    rows: dict[int, float]
    source: str
    section: str
    batch_source: str = ""

    @property
    def multi_node(self) -> bool:
        return max(self.rows) > self.gpus_per_node

    def roles(self) -> dict[int, str]:
        """Which rows fit what: the first row c; then a multi-node table's next row its link,
        a single-node table's middle rows alpha; the last row (and every later one) held out."""
        gpus = sorted(self.rows)
        out = {gpus[0]: FIT_C}
        rest = gpus[1:]
        if self.multi_node and len(rest) > 1:
            out[rest[0]] = FIT_LINK
            rest = rest[1:]
        elif not self.multi_node:
            for n in rest[:-1]:
                out[n] = FIT_ALPHA
            rest = rest[-1:]
        for n in rest:
            out[n] = HELD_OUT
        return out


def _resnet(key, title, device, precision, batch, rows) -> PublishedTable:
    return PublishedTable(
        key=key,
        title=title,
        model="resnet50",
        device=device,
        precision=precision,
        local_batch=batch,
        gpus_per_node=8,
        rows=rows,
        source=RESNET_README,
        section="Training performance results (pytorch-21.03 NGC container)",
        batch_source=f"{RESNET_CONFIGS} (models.resnet50, batch_size)",
    )


def _bert(key, title, device, precision, batch, per_node, rows, section) -> PublishedTable:
    return PublishedTable(
        key=key,
        title=title,
        model="bert-large",
        device=device,
        precision=precision,
        local_batch=batch,
        gpus_per_node=per_node,
        rows=rows,
        source=BERT_README,
        section=section,
        batch_source="the table's own batch size / GPU column",
    )


_DGX1 = "Pre-training NVIDIA DGX-1 With 16G (pytorch:19.07-py3), sequence length 128"
_DGX2 = "Pre-training NVIDIA DGX-2 With 32G (pytorch:19.07-py3), sequence length 128"
TABLES: tuple[PublishedTable, ...] = (
    _resnet(
        "resnet50-dgx1-fp32",
        "ResNet-50 v1.5, DGX-1 (8x V100 16GB), FP32",
        "V100",
        "fp32",
        112,
        {1: 367.0, 8: 2855.0},
    ),
    _resnet(
        "resnet50-dgx1-amp",
        "ResNet-50 v1.5, DGX-1 (8x V100 16GB), mixed precision",
        "V100",
        "mixed",
        256,
        {1: 1200.0, 8: 8322.0},
    ),
    _resnet(
        "resnet50-dgxa100-tf32",
        "ResNet-50 v1.5, DGX A100 (8x A100 80GB), TF32",
        "A100",
        "tf32",
        256,
        {1: 938.0, 8: 7248.0},
    ),
    _resnet(
        "resnet50-dgxa100-amp",
        "ResNet-50 v1.5, DGX A100 (8x A100 80GB), mixed precision",
        "A100",
        "mixed",
        256,
        {1: 2470.0, 8: 16621.0},
    ),
    _bert(
        "bert-large-dgx1-fp32",
        "BERT-Large pre-training, DGX-1 (8x V100 16G), FP32",
        "V100",
        "fp32",
        8,
        8,
        {1: 33.36, 4: 121.92, 8: 245.12},
        _DGX1,
    ),
    _bert(
        "bert-large-dgx1-mixed",
        "BERT-Large pre-training, DGX-1 (8x V100 16G), mixed precision",
        "V100",
        "mixed",
        16,
        8,
        {1: 125.44, 4: 458.24, 8: 919.04},
        _DGX1,
    ),
    _bert(
        "bert-large-dgx2-fp32",
        "BERT-Large pre-training, DGX-2 (16x V100 32G), FP32",
        "V100",
        "fp32",
        32,
        16,
        {1: 43.52, 4: 168.96, 8: 335.36, 16: 665.6},
        _DGX2,
    ),
    _bert(
        "bert-large-dgx2-mixed",
        "BERT-Large pre-training, DGX-2 (16x V100 32G), mixed precision",
        "V100",
        "mixed",
        64,
        16,
        {1: 181.76, 4: 704.0, 8: 1402.88, 16: 2775.04},
        _DGX2,
    ),
    _bert(
        "bert-large-dgx1-nodes-mixed",
        "BERT-Large pre-training, 1-16 DGX-1 (8x V100 16G each), mixed precision",
        "V100",
        "mixed",
        16,
        8,
        {8: 874.24, 32: 3089.76, 128: 12144.64},
        "Pre-training on multiple NVIDIA DGX-1 With 16G, sequence length 128",
    ),
    _bert(
        "bert-large-dgx2h-nodes-mixed",
        "BERT-Large pre-training, 1-64 DGX-2H (16x V100 32G each), mixed precision",
        "V100",
        "mixed",
        64,
        16,
        {16: 3379.2, 64: 12709.88, 256: 51937.28, 1024: 188088.32},
        "Pre-training on multiple NVIDIA DGX-2H With 32G, sequence length 128",
    ),
)

ASSUMPTIONS = (
    "one all-reduce per step of the batch shown (the BERT README does not say whether its "
    "throughput rows accumulate gradients over several batches; its pre-training runs do)",
    "torch DDP's buckets (1 MiB, then 25 MiB) of fp32 gradients, fp16 under mixed precision; "
    "no overlap of communication with backward",
    "inside a node: a ring at the simulator's intra-node bandwidth for the GPU family "
    "(model.INTRA_NODE_GBPS: an approximate figure, not from these sources, not fitted here)",
    "across nodes: reduce inside each node, then a ring across nodes (hierarchical)",
    "gradient bytes from the simulator's model sizes (ResNet-50 25.6M, BERT-Large 340M "
    "parameters); compute per sample is fitted, so no FLOP count or peak enters",
)


@dataclass
class Fit:
    """The fitted figures: c per table (s/sample per GPU), alpha_s, a per-node link per
    multi-node table (Gbit/s; None: no link cost fits the row, so the link is unlimited)."""

    per_sample_s: dict[str, float] = field(default_factory=dict)
    alpha_s: float = 0.0
    node_gbps: dict[str, float | None] = field(default_factory=dict)


def _workers(t: PublishedTable, n: int, c: float, node_gbps: float | None) -> list[WorkerModel]:
    share = None if node_gbps is None else node_gbps / t.gpus_per_node
    return [
        WorkerModel(
            f"g{i}",
            0.0,
            c,
            link_gbps=share,
            node=f"n{i // t.gpus_per_node}",
            device=t.device,
        )
        for i in range(n)
    ]


def _network(t: PublishedTable, alpha_s: float) -> Network:
    return Network(
        collective="hierarchical",
        alpha_s=alpha_s,
        intra_alpha_s=alpha_s,
        intra_gbps=INTRA_NODE_GBPS[t.device],
        compression_ratio=2.0 if t.precision == "mixed" else 1.0,
    )


def predict(
    t: PublishedTable, n: int, c: float, alpha_s: float, node_gbps: float | None = None
) -> StepPrediction:
    """One row of a table as the simulator predicts it from these figures."""
    job = Job(MODELS[t.model], local_batch=t.local_batch)
    return simulate_step(_workers(t, n, c, node_gbps), job, _network(t, alpha_s), "baseline")


def _step_s(t: PublishedTable, n: int) -> float:
    """The published step time of a row: the global batch over its throughput."""
    return n * t.local_batch / t.rows[n]


def _fit_c(t: PublishedTable, alpha_s: float) -> float:
    """c such that the first row's step is the published one (step is linear in c)."""
    n = min(t.rows)
    probe = 1e-3
    rest = predict(t, n, probe, alpha_s).step_time_s - probe * t.local_batch
    c = (_step_s(t, n) - rest) / t.local_batch
    if not c > 0:
        raise ValueError(f"{t.key}: communication alone exceeds the first row's step")
    return c


def _fit_alpha(tables: tuple[PublishedTable, ...]) -> float:
    """alpha_s minimising the squared relative step error over the alpha rows (the step is
    linear in alpha), floored at 0."""
    num = den = 0.0
    for t in tables:
        c = _fit_c(t, 0.0)  # single-node first rows hold one GPU: no alpha in them
        for n, role in t.roles().items():
            if role != FIT_ALPHA:
                continue
            base = predict(t, n, c, 0.0).step_time_s
            slope = (predict(t, n, c, 1e-6).step_time_s - base) / 1e-6
            meas = _step_s(t, n)
            num += slope * (meas - base) / meas**2
            den += slope**2 / meas**2
    return max(0.0, num / den) if den else 0.0


def _fit_link(t: PublishedTable, c: float, alpha_s: float) -> float | None:
    """The per-node link at which the link row's step is the published one (linear in
    1/bandwidth); None if the row is not slower than the model with an unlimited link."""
    (n,) = [k for k, r in t.roles().items() if r == FIT_LINK]
    free = predict(t, n, c, alpha_s, None).step_time_s
    at_one = predict(t, n, c, alpha_s, 1.0).step_time_s - free  # seconds x Gbit/s
    extra = _step_s(t, n) - free
    return at_one / extra if extra > 0 else None


def fit(tables: tuple[PublishedTable, ...] = TABLES) -> Fit:
    """Every free figure, from the fit rows only (held-out rows are never read)."""
    single = tuple(t for t in tables if not t.multi_node)
    out = Fit(alpha_s=_fit_alpha(single))
    for t in tables:
        out.per_sample_s[t.key] = _fit_c(t, out.alpha_s)
        if t.multi_node:
            out.node_gbps[t.key] = _fit_link(t, out.per_sample_s[t.key], out.alpha_s)
    return out


def published_comparison(tables: tuple[PublishedTable, ...] = TABLES) -> dict:
    """Ours beside theirs for every row, each with its role, and the error on held-out rows."""
    f = fit(tables)
    rows, info = [], []
    for t in tables:
        c, link = f.per_sample_s[t.key], f.node_gbps.get(t.key)
        for n, role in sorted(t.roles().items()):
            p = predict(t, n, c, f.alpha_s, link)
            theirs = t.rows[n]
            linear = n / min(t.rows) * t.rows[min(t.rows)]  # the first row, n / n0 times
            rows.append(
                {
                    "table": t.key,
                    "gpus": n,
                    "nodes": math.ceil(n / t.gpus_per_node),
                    "role": role,
                    "theirs_samples_per_s": theirs,
                    "ours_samples_per_s": p.throughput_samples_per_s,
                    "rel_error": p.throughput_samples_per_s / theirs - 1,
                    "theirs_scaling": theirs / linear,
                    "ours_scaling": p.throughput_samples_per_s / linear,
                    "comm_share": p.exposed_comm_s / p.step_time_s,
                }
            )
        info.append(
            {
                "key": t.key,
                "title": t.title,
                "source": t.source,
                "section": t.section,
                "batch_source": t.batch_source,
                "local_batch": t.local_batch,
                "precision": t.precision,
                "gpus_per_node": t.gpus_per_node,
                "fitted_per_sample_ms": c * 1e3,
                "fitted_node_gbps": link,
            }
        )
    held = [abs(r["rel_error"]) for r in rows if r["role"] == HELD_OUT]
    fitted = [abs(r["rel_error"]) for r in rows if r["role"] != HELD_OUT]
    return {
        "rows": rows,
        "tables": info,
        "fitted": {"alpha_us": f.alpha_s * 1e6},
        "assumptions": list(ASSUMPTIONS),
        "held_out_rows": len(held),
        "held_out_max_abs_error": max(held),
        "held_out_mean_abs_error": sum(held) / len(held),
        "fit_rows": len(fitted),
        "fit_max_abs_error": max(fitted),
    }
