"""Top-k sparsification with error feedback, as a DDP comm hook (torch has none).

Each rank keeps a residual per DDP bucket, sends the k largest-magnitude entries of gradient +
residual (fp32 values and int32 indices in one all-gather) and keeps the rest for the next
step. With SGD momentum handed over (`TopKState.optimizer`), this is Deep Gradient
Compression's momentum correction (Lin et al., 2018). After the dense warm-up the share of
entries sent follows DGC's density stages (`topk_density`) down to the method's ratio.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

# Top-k's density warm-up after the dense steps (Deep Gradient Compression's schedule): 25%,
# 6.25%, 1.56%, ... of the entries, each for this many steps, until the method's own ratio.
DENSITY_STAGE_STEPS = 8


def topk_count(numel: int, ratio: float) -> int:
    """Entries kept of a `numel`-element bucket at `ratio` (at least one)."""
    return max(1, min(numel, math.ceil(ratio * numel - 1e-9)))


def topk_density(
    ratio: float, compressed_steps: int, stage_steps: int = DENSITY_STAGE_STEPS
) -> float:
    """Share of entries top-k sends in its `compressed_steps`-th step after the dense warm-up.

    Deep Gradient Compression (Lin et al., 2018) warms up by sending 25%, then 6.25%, 1.56%, ...
    (a quarter less each stage) before the final ratio: sending `ratio` from the first
    compressed step leaves most of the early, large gradients in the residuals, and costs
    accuracy (measured: docs/measurements/comm.md). `stage_steps` 0: no stages.
    """
    if stage_steps <= 0:
        return ratio
    return max(ratio, 0.25 / 4 ** (compressed_steps // stage_steps))


def topk_warmup_steps(
    ratio: float, warmup_steps: int, stage_steps: int = DENSITY_STAGE_STEPS
) -> int:
    """Steps before top-k sends at its own ratio: `warmup_steps` dense ones, then the density
    stages."""
    stages = 0
    while stage_steps > 0 and topk_density(ratio, stages * stage_steps, stage_steps) > ratio:
        stages += 1
    return warmup_steps + stages * stage_steps


def select_topk(
    magnitude: torch.Tensor, k: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Indices of the k largest entries of a 1-D tensor (exact; order unspecified).

    A full `topk` over millions of entries is slow on a CPU, so for large tensors a threshold is
    first estimated from a random sample (as in Deep Gradient Compression) at twice the wanted
    density; every entry above it is a candidate, and the exact top-k is taken among the
    candidates. If the sample under-estimates (fewer than k candidates), fall back to `topk`.
    """
    n = magnitude.numel()
    if k >= n:
        return torch.arange(n)
    density = k / n
    sample = min(n, max(4096, math.ceil(200 / density)))
    if n < 65536 or density > 0.1 or sample * 4 > n:
        return magnitude.topk(k, sorted=False).indices
    pick = torch.randint(0, n, (sample,), generator=generator)
    kth = max(1, math.ceil(2 * density * sample))
    threshold = magnitude[pick].topk(kth, sorted=False).values.min()
    candidates = (magnitude >= threshold).nonzero().squeeze(1)
    if candidates.numel() < k:
        return magnitude.topk(k, sorted=False).indices
    return candidates[magnitude[candidates].topk(k, sorted=False).indices]


class TopKState:
    """Per-bucket residuals (error feedback), momentum buffers and the warm-up counter of
    `topk_hook`. `wrap_optimizer` sets `optimizer` when the hook takes over SGD's momentum.

    The buffers follow DDP's bucket layout, which DDP changes after the first step of every new
    DDP instance (it re-orders the parameters by when their gradients were ready). `params`
    (the model's parameters, in order) lets the state name each slice by its parameter, so
    that a layout change, or a resume into a new DDP instance, re-orders the slices instead of
    mixing them up. `warmup_steps`: dense steps before the first compressed one.
    """

    KEPT = ("residuals", "velocities")

    def __init__(
        self,
        ratio: float,
        process_group=None,
        *,
        warmup_steps: int,
        seed: int = 0,
        params=(),
        stage_steps: int = DENSITY_STAGE_STEPS,
    ):
        if not 0 < ratio <= 1:
            raise ValueError(f"train.compression: topk ratio must be in (0, 1] (got {ratio})")
        self.ratio = ratio
        self.process_group = process_group
        self.warmup_steps = warmup_steps
        self.stage_steps = stage_steps
        self.iter = 0
        self.residuals: dict[int, torch.Tensor] = {}
        self.magnitudes: dict[int, torch.Tensor] = {}
        self.velocities: dict[int, torch.Tensor] = {}
        self.layouts: dict[int, tuple[int, ...]] = {}  # bucket -> its parameters' indices
        # slices not in a bucket's buffer yet, by parameter index
        self.loose: dict[str, dict[int, torch.Tensor]] = {name: {} for name in self.KEPT}
        self.param_index = {p: k for k, p in enumerate(params)}
        self.numels = {k: p.numel() for p, k in self.param_index.items()}
        self.generator = torch.Generator().manual_seed(seed)
        self.optimizer: torch.optim.SGD | None = None
        self.momentum = 0.0

    def layout(self, bucket) -> tuple[int, ...]:
        return tuple(self.param_index.get(p, -1) for p in bucket.parameters())

    def by_parameter(self, name: str) -> dict[int, torch.Tensor]:
        """Every slice of `residuals` or `velocities` held, keyed by parameter index."""
        out = dict(self.loose[name])
        for i, store in ((i, getattr(self, name)) for i in self.layouts):
            if i in store:
                layout = self.layouts[i]
                sizes = [self.numels[k] for k in layout]
                out.update(zip(layout, store[i].split(sizes), strict=True))
        return out

    def lay_out(self, i: int, bucket) -> None:
        """(Re)build bucket i's buffers for its current layout from the slices held."""
        layout, buf = self.layout(bucket), bucket.buffer()
        known = -1 not in layout
        held = {name: self.by_parameter(name) if known else {} for name in self.KEPT}
        self.layouts[i] = layout
        for name in self.KEPT:
            pieces = held[name]
            if known and all(k in pieces for k in layout):
                pieces_ = [pieces[k] for k in layout]
                getattr(self, name)[i] = torch.cat(pieces_).to(buf.device, buf.dtype)
            elif name == "residuals":
                self.residuals[i] = torch.zeros_like(buf)
            elif self.optimizer is not None:
                self.velocities[i] = self.take_over_momentum(bucket)
            for k in layout:
                self.loose[name].pop(k, None)
        self.magnitudes[i] = torch.empty_like(buf)

    def state_dict(self) -> dict:
        """Warm-up counter, residuals and momentum by parameter: what a checkpoint must keep so
        that a resumed run compresses as the lost one would have (the optimizer's own state
        holds momentum 0 once the hook has taken it over)."""
        kept = {
            name: {k: t.clone() for k, t in self.by_parameter(name).items()} for name in self.KEPT
        }
        return {
            "iter": self.iter,
            "momentum": self.momentum,
            "generator": self.generator.get_state(),
            **kept,
        }

    def load_state_dict(self, saved: dict) -> None:
        self.iter, self.momentum = saved["iter"], saved["momentum"]
        self.generator.set_state(saved["generator"])
        self.residuals, self.velocities, self.magnitudes, self.layouts = {}, {}, {}, {}
        self.loose = {name: dict(saved[name]) for name in self.KEPT}

    def take_over_momentum(self, bucket) -> torch.Tensor:
        """The bucket's momentum buffer, taken from SGD (whose momentum is then set to 0)."""
        parts = []
        for p in bucket.parameters():
            buf = self.optimizer.state.get(p, {}).get("momentum_buffer")
            if buf is None:
                parts.append(torch.zeros(p.numel(), dtype=p.dtype, device=p.device))
            else:
                parts.append(buf.detach().reshape(-1))
        for g in self.optimizer.param_groups:
            g["momentum"] = 0.0
        return torch.cat(parts)


def encode_topk(
    acc: torch.Tensor,
    k: int,
    generator=None,
    scale: float = 1.0,
    magnitude: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(payload, indices): the k largest-magnitude entries of `acc` as bytes (values x `scale`,
    then int32 indices) and their indices; those entries of `acc` are zeroed in place, so that
    `acc` is left holding what error feedback carries to the next step. `magnitude`, if given,
    is scratch space for |acc|."""
    if acc.numel() >= 2**31:
        raise ValueError("topk: a bucket of 2^31 entries or more does not fit int32 indices")
    magnitude = torch.abs(acc, out=magnitude) if magnitude is not None else acc.abs()
    idx = select_topk(magnitude, k, generator)
    values = acc[idx]
    if scale != 1.0:
        values.mul_(scale)
    acc[idx] = 0
    payload = torch.cat([values.view(torch.uint8), idx.to(torch.int32).view(torch.uint8)])
    return payload, idx


def decode_topk_into(out: torch.Tensor, payloads: list[torch.Tensor], k: int) -> torch.Tensor:
    """out = sum of the sparse contributions (in place)."""
    split = k * out.element_size()
    out.zero_()
    for p in payloads:
        out.index_add_(0, p[split:].view(torch.int32).long(), p[:split].view(out.dtype))
    return out


def _accumulate(state: TopKState, i: int, bucket) -> torch.Tensor:
    """Bucket i's error-fed-back sum: residual + gradient, or residual + momentum u (u = m u + g)
    when the hook holds the momentum."""
    buf = bucket.buffer()
    acc = state.residuals.get(i)
    if acc is None or acc.numel() != buf.numel() or state.layouts.get(i) != state.layout(bucket):
        state.lay_out(i, bucket)  # first use, or DDP re-ordered its buckets (see TopKState)
        acc = state.residuals[i]
    u = state.velocities.get(i)
    if u is not None:
        u.mul_(state.momentum).add_(buf)
        acc.add_(u)
    else:
        acc.add_(buf)
    return acc


def topk_hook(state, bucket):  # (TopKState, GradBucket) -> Future; unannotated: see methods
    """DDP comm hook: top-k sparsified, error-fed-back gradient averaging via one all-gather.

    With SGD momentum handed over by `wrap_optimizer`, each rank accumulates its own momentum u
    and sends the top-k of the error-fed-back sum of u; SGD then steps without momentum.
    Without it, plain error feedback on gradients. DGC's momentum factor masking (clearing u
    where it sent) is left out: it drops momentum at exactly the entries sent, so that at a
    density of 1 the method would be SGD without momentum, and it cost accuracy (measured:
    docs/measurements/comm.md). After the dense warm-up the density follows `topk_density`.
    Works in place on per-bucket buffers kept across steps: allocating and faulting in fresh
    bucket-sized tensors every step costs more than the selection.
    """
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    buf = bucket.buffer()
    compressed_steps = state.iter - state.warmup_steps  # negative while warming up
    if bucket.is_last():
        state.iter += 1
    if compressed_steps < 0:
        return default_hooks._allreduce_fut(group, buf)
    i = bucket.index()
    acc = _accumulate(state, i, bucket)
    k = topk_count(acc.numel(), topk_density(state.ratio, compressed_steps, state.stage_steps))
    payload, _ = encode_topk(
        acc, k, state.generator, scale=1.0 / world, magnitude=state.magnitudes[i]
    )
    gathered = [torch.empty_like(payload) for _ in range(world)]
    work = dist.all_gather(gathered, payload, group=group, async_op=True)

    def decompress(fut):
        fut.wait()
        return decode_topk_into(buf, gathered, k)

    return work.get_future().then(decompress)
