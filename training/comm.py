"""Gradient communication: DDP comm hooks by name, wire-byte accounting, emulated links.

Methods (`TrainConfig.compression`):

- `none`, `fp16`, `bf16`: torch's `default_hooks` (all-reduce of fp32 / fp16 / bf16 buckets);
- `powersgd:R`: torch's `powerSGD_hook` (rank R, error feedback, warm start);
- `topk:RATIO`: sparsification with error feedback, written here as a DDP comm hook (torch has
  none): each rank keeps a residual per bucket, sends the RATIO largest-magnitude entries of
  gradient + residual (values and int32 indices in one all-gather) and keeps the rest;
- `localsgd:H`: torch's `post_localSGD_hook` without gradient synchronization plus
  `PostLocalSGDOptimizer` / `PeriodicModelAverager`: the model is averaged every H steps;
- `hierarchical:H`: gradients are all-reduced inside each node (`WorkerSpec.node`) every step
  (`post_localSGD_hook` with a per-node subgroup) and the model is averaged across nodes every H
  steps. Traffic inside a node does not cross the emulated network link and is counted apart.

Every compressing method runs plain all-reduce for its first `WARMUP_STEPS` steps (torch's
`start_powerSGD_iter` / `start_localSGD_iter`): early gradients are the most sensitive to
compression error.

Bytes are counted where every collective passes: torch's hooks and model averagers, and the
top-k hook here, call `torch.distributed.all_reduce` / `all_gather` through the module, so
`WireCounter` wraps those functions (and `all_gather_into_tensor`) for the life of a worker and
charges each call what the algorithm puts on the wire from this rank: a ring all-reduce of B
bytes over n ranks sends 2(n-1)/n x B, an all-gather of a B-byte contribution sends (n-1) x B.
torch offers no per-collective callback, hence the wrapper.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import (
    default_hooks,
    post_localSGD_hook,
    powerSGD_hook,
)

from hetflow.records import CompressionMethod

log = logging.getLogger(__name__)

WARMUP_STEPS = 10
# Top-k's density warm-up after the dense steps (Deep Gradient Compression's schedule): 25%,
# 6.25%, 1.56%, ... of the entries, each for this many steps, until the method's own ratio.
DENSITY_STAGE_STEPS = 8

# Process groups whose members share a node: their traffic does not use the emulated link.
_INTRA_NODE_GROUPS: list = []
# Process groups for the ranks' own control messages (step timings), apart from the gradients'.
_CONTROL_GROUPS: list = []


def new_control_group():
    """A gloo group for small control collectives (the ranks' step timings), so that they never
    queue with the gradients' collectives; `WireCounter` counts its bytes as `control_bytes`,
    not as gradient traffic over the emulated link. Every rank must call it, in the same order."""
    group = dist.new_group(backend="gloo")
    _CONTROL_GROUPS.append(group)
    return group


def ring_allreduce_bytes(nbytes: int, world: int) -> float:
    return 2 * (world - 1) / world * nbytes if world > 1 else 0.0


def allgather_bytes(nbytes: int, world: int) -> float:
    return (world - 1) * nbytes if world > 1 else 0.0


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _group_arg(args: tuple, kwargs: dict, position: int):
    """The `group` argument of a collective, given by keyword or at `position`."""
    if "group" in kwargs:
        return kwargs["group"]
    return args[position] if len(args) > position else None


@dataclass
class WireCounter:
    """Bytes this rank sent and collectives it issued; `take()` returns and resets the window.

    The window and `total_bytes` hold the gradients' traffic over the network link; collectives
    inside a node-local group (hierarchical averaging) go to `intra_node_bytes` only, and those
    of a control group (`new_control_group`) to `control_bytes` only.
    """

    world: int
    bytes_sent: float = 0.0
    collectives: int = 0
    total_bytes: float = 0.0
    intra_node_bytes: float = 0.0
    control_bytes: float = 0.0
    _restore: tuple = field(default=(), repr=False)

    def install(self) -> None:
        real = (dist.all_reduce, dist.all_gather, dist.all_gather_into_tensor)
        real_all_reduce, real_all_gather, real_all_gather_into_tensor = real

        def all_reduce(tensor, *args, **kwargs):
            group = _group_arg(args, kwargs, 1)  # all_reduce(tensor, op, group, async_op)
            self._charge(ring_allreduce_bytes(_nbytes(tensor), self._size(group)), group)
            return real_all_reduce(tensor, *args, **kwargs)

        def all_gather(tensor_list, tensor, *args, **kwargs):
            group = _group_arg(args, kwargs, 0)  # all_gather(tensor_list, tensor, group, async_op)
            self._charge(allgather_bytes(_nbytes(tensor), self._size(group)), group)
            return real_all_gather(tensor_list, tensor, *args, **kwargs)

        def all_gather_into_tensor(output_tensor, input_tensor, *args, **kwargs):
            group = _group_arg(args, kwargs, 0)
            self._charge(allgather_bytes(_nbytes(input_tensor), self._size(group)), group)
            return real_all_gather_into_tensor(output_tensor, input_tensor, *args, **kwargs)

        dist.all_reduce, dist.all_gather = all_reduce, all_gather
        dist.all_gather_into_tensor = all_gather_into_tensor
        self._restore = real

    def uninstall(self) -> None:
        if self._restore:
            dist.all_reduce, dist.all_gather, dist.all_gather_into_tensor = self._restore
            self._restore = ()

    def _size(self, group) -> int:
        return dist.get_world_size(group) if group is not None else self.world

    def _charge(self, nbytes: float, group=None) -> None:
        if group is not None and self._size(group) == 1:
            return  # a group of one rank (the profile's compute probe) puts nothing on a link
        if group is not None and any(group is g for g in _INTRA_NODE_GROUPS):
            self.intra_node_bytes += nbytes
            return
        if group is not None and any(group is g for g in _CONTROL_GROUPS):
            self.control_bytes += nbytes
            return
        self.bytes_sent += nbytes
        self.total_bytes += nbytes
        self.collectives += 1

    def take(self) -> tuple[float, int]:
        out = (self.bytes_sent, self.collectives)
        self.bytes_sent, self.collectives = 0.0, 0
        return out


# ---------------------------------------------------------------------------------------------
# method names

def parse_method(method: str) -> tuple[str, float | int | None]:
    """(name, argument) of a method; errors name `train.compression`."""
    try:
        m = CompressionMethod.parse(method)
    except ValueError as e:
        raise ValueError(f"train.compression: {e}") from None
    return m.name, next((v for v in (m.rank, m.ratio, m.period) if v is not None), None)


# ---------------------------------------------------------------------------------------------
# top-k sparsification with error feedback


def topk_count(numel: int, ratio: float) -> int:
    """Entries kept of a `numel`-element bucket at `ratio` (at least one)."""
    return max(1, min(numel, math.ceil(ratio * numel - 1e-9)))


def topk_density(ratio: float, compressed_steps: int, stage_steps: int = DENSITY_STAGE_STEPS) -> float:
    """Share of entries top-k sends in its `compressed_steps`-th step after the dense warm-up.

    Deep Gradient Compression (Lin et al., 2018) warms up by sending 25%, then 6.25%, 1.56%, ...
    (a quarter less each stage) before the final ratio; sending 1% from the first compressed
    step leaves most of the early, large gradients in the residuals. Mean over seeds 0-2 of
    `hetflow bench comm --methods none,topk:0.01 --link-gbps 0 --seed S` (wide_mlp, 59 steps):
    -1.58 pp against `none` without the stages, -0.46 pp (-0.28, -1.11, 0.00) with 8-step ones.
    """
    if stage_steps <= 0:
        return ratio
    return max(ratio, 0.25 / 4 ** (compressed_steps // stage_steps))


def topk_warmup_steps(ratio: float, warmup_steps: int = WARMUP_STEPS, stage_steps: int = DENSITY_STAGE_STEPS) -> int:
    """Steps before top-k sends at its own ratio: the dense ones, then the density stages."""
    stages = 0
    while stage_steps > 0 and topk_density(ratio, stages * stage_steps, stage_steps) > ratio:
        stages += 1
    return warmup_steps + stages * stage_steps


def select_topk(magnitude: torch.Tensor, k: int, generator: torch.Generator | None = None) -> torch.Tensor:
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
    mixing them up.
    """

    KEPT = ("residuals", "velocities")

    def __init__(self, ratio: float, process_group=None, warmup_steps: int = WARMUP_STEPS, seed: int = 0,
                 params=(), stage_steps: int = DENSITY_STAGE_STEPS):
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
        self.loose: dict[str, dict[int, torch.Tensor]] = {name: {} for name in self.KEPT}  # by parameter
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
                out.update(zip(layout, store[i].split([self.numels[k] for k in layout]), strict=True))
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
                getattr(self, name)[i] = torch.cat([pieces[k] for k in layout]).to(buf.dtype)
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
        return {"iter": self.iter, "momentum": self.momentum, "generator": self.generator.get_state(),
                **{name: {k: t.clone() for k, t in self.by_parameter(name).items()} for name in self.KEPT}}

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
            parts.append(torch.zeros(p.numel(), dtype=p.dtype) if buf is None else buf.detach().reshape(-1))
        for g in self.optimizer.param_groups:
            g["momentum"] = 0.0
        return torch.cat(parts)


def encode_topk(
    acc: torch.Tensor, k: int, generator=None, scale: float = 1.0, magnitude: torch.Tensor | None = None
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


def topk_hook(state, bucket):  # (TopKState, dist.GradBucket) -> Future[Tensor]; see _bf16_hook
    """DDP comm hook: top-k sparsified, error-fed-back gradient averaging via one all-gather.

    With SGD momentum handed over by `wrap_optimizer`, this is Deep Gradient Compression's
    momentum correction (Lin et al., 2018): each rank accumulates its own momentum u and sends
    the top-k of the error-fed-back sum of u; SGD then steps without momentum. Without it, plain
    error feedback on gradients. DGC's momentum factor masking (clearing u where it sent) is
    left out: it drops momentum at exactly the entries sent, so that at a density of 1 the
    method is SGD without momentum; with it (commit 40877a5), top-k at 1% lost 3.06 pp against
    `none` over the seeds `topk_density` cites, without it 1.58. After the dense warm-up the
    density follows `topk_density`.
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
    k = topk_count(acc.numel(), topk_density(state.ratio, compressed_steps, state.stage_steps))
    payload, _ = encode_topk(acc, k, state.generator, scale=1.0 / world, magnitude=state.magnitudes[i])
    gathered = [torch.empty_like(payload) for _ in range(world)]
    work = dist.all_gather(gathered, payload, group=group, async_op=True)

    def decompress(fut):
        fut.wait()
        return decode_topk_into(buf, gathered, k)

    return work.get_future().then(decompress)


# ---------------------------------------------------------------------------------------------
# registering a method on a DDP model


def _bf16_hook(state, bucket):  # no annotations: DDP checks them and these would be strings
    """torch's bf16_compress_hook under another name: DDP refuses that name unless NCCL >= 2.10
    is present, but gloo all-reduces bf16 on CPU too."""
    return default_hooks.bf16_compress_hook(state, bucket)


def _powersgd_hook(state, bucket):  # see _bf16_hook
    """torch's powerSGD_hook, waited for before backward goes on to the next bucket.

    PowerSGD issues its P and Q all-reduces from future callbacks, which gloo runs on its own
    threads: with more than one bucket in flight, ranks can issue the collectives of different
    buckets in different orders, and gloo fails ("Received data size doesn't match expected
    size"). Finishing one bucket's exchange before the next starts keeps the order the same on
    every rank, at the cost of overlapping communication with the rest of backward.
    """
    fut = powerSGD_hook.powerSGD_hook(state, bucket)
    fut.wait()
    return fut


def _node_groups(nodes: list[str]) -> list[list[int]]:
    order: dict[str, list[int]] = {}
    for rank, node in enumerate(nodes):
        order.setdefault(node, []).append(rank)
    return list(order.values())


def _stateful_warmup(warmup_steps: int) -> int:
    """Dense steps before PowerSGD or top-k compress: at least 2, since DDP rebuilds its buckets
    after the first step, which would scramble their per-bucket state (residuals, factors)."""
    return max(2, warmup_steps)


def method_warmup_steps(method: str, warmup_steps: int = WARMUP_STEPS,
                        density_stage_steps: int = DENSITY_STAGE_STEPS) -> int:
    """Steps before `method` sends as it will for the rest of the run (its warm-up), as
    `register_compression` sets it up."""
    name, arg = parse_method(method)
    if name in ("none", "fp16", "bf16"):
        return 0
    if name == "powersgd":
        return _stateful_warmup(warmup_steps)
    if name == "topk":
        return topk_warmup_steps(float(arg), _stateful_warmup(warmup_steps), density_stage_steps)
    return warmup_steps


def register_compression(
    ddp: torch.nn.parallel.DistributedDataParallel,
    method: str,
    hook_wrapper=lambda hook: hook,
    *,
    nodes: list[str] | None = None,
    warmup_steps: int = WARMUP_STEPS,
    density_stage_steps: int = DENSITY_STAGE_STEPS,
):
    """Attach the comm hook for `method` (never 'auto'), wrapped by `hook_wrapper(hook)`.

    `nodes[r]` names the node of rank r (needed by `hierarchical:H`). `density_stage_steps`:
    top-k's density warm-up (`topk_density`; 0: none). Returns the hook's state; pass it to
    `wrap_optimizer`.
    """
    name, arg = parse_method(method)
    if name == "none":
        state, hook = None, default_hooks.allreduce_hook
    elif name == "fp16":
        state, hook = None, default_hooks.fp16_compress_hook
    elif name == "bf16":
        state, hook = None, _bf16_hook
    elif name == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=int(arg), start_powerSGD_iter=_stateful_warmup(warmup_steps),
            min_compression_rate=1, use_error_feedback=True, warm_start=True, random_seed=0,
        )
        hook = _powersgd_hook
    elif name == "topk":
        state = TopKState(float(arg), warmup_steps=_stateful_warmup(warmup_steps), params=list(ddp.module.parameters()),
                          stage_steps=density_stage_steps)
        hook = topk_hook
    elif name == "localsgd":
        state = post_localSGD_hook.PostLocalSGDState(
            process_group=None, subgroup=None, start_localSGD_iter=warmup_steps,
            post_local_gradient_allreduce=False,
        )
        hook = post_localSGD_hook.post_localSGD_hook
    elif name == "hierarchical":
        if nodes is None:
            raise ValueError(
                "train.compression: hierarchical averaging needs the node of every worker "
                "(register_compression(..., nodes=[w.node for w in cluster.workers]))"
            )
        if len(nodes) != dist.get_world_size():
            raise ValueError(f"cluster.workers.node: {len(nodes)} nodes for {dist.get_world_size()} ranks")
        subgroup, _ = dist.new_subgroups_by_enumeration(_node_groups(nodes))
        _INTRA_NODE_GROUPS.append(subgroup)
        state = post_localSGD_hook.PostLocalSGDState(
            process_group=None, subgroup=subgroup, start_localSGD_iter=warmup_steps,
            post_local_gradient_allreduce=True,
        )
        hook = post_localSGD_hook.post_localSGD_hook
    else:  # pragma: no cover - parse_method knows every name above
        raise ValueError(f"train.compression: {method!r} is not implemented")
    ddp.register_comm_hook(state, hook_wrapper(hook))
    return state


def wrap_optimizer(optimizer: torch.optim.Optimizer, method: str, state) -> torch.optim.Optimizer:
    """The optimizer the method needs.

    Local SGD averages the model after the optimizer's step (PostLocalSGDOptimizer). Top-k
    takes over plain SGD momentum once compression starts (see `topk_hook`).
    """
    name, arg = parse_method(method)
    momentum = _plain_momentum(optimizer)
    # At ratio 1 everything is sent and nothing is left to correct: SGD keeps its momentum.
    if name == "topk" and isinstance(state, TopKState) and momentum and state.ratio < 1:
        state.optimizer, state.momentum = optimizer, momentum
    if name not in ("localsgd", "hierarchical"):
        return optimizer
    import warnings

    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
    from torch.distributed.optim import PostLocalSGDOptimizer

    with warnings.catch_warnings():  # period 1 is allowed (it is plain synchronous SGD)
        warnings.simplefilter("ignore")
        averager = PeriodicModelAverager(period=int(arg), warmup_steps=state.start_localSGD_iter)
    return PostLocalSGDOptimizer(optimizer, averager)


def comm_state_dict(state) -> dict | None:
    """What a checkpoint keeps of a comm hook's state (`register_compression`'s return); None
    for the stateless hooks. Top-k keeps everything (see `TopKState.state_dict`). PowerSGD and
    local SGD keep their step counter, so a resumed run does not warm up again; PowerSGD's error
    feedback and warm-start factors are keyed by bucket position, which a new DDP instance
    re-orders after its first step, so they start again from zero. Local SGD's model averager
    is in its optimizer's state."""
    if isinstance(state, TopKState):
        return state.state_dict()
    if isinstance(state, powerSGD_hook.PowerSGDState | post_localSGD_hook.PostLocalSGDState):
        return {"iter": state.iter}
    return None


def load_comm_state(state, saved: dict | None) -> None:
    """Restore `comm_state_dict`'s output into a freshly registered hook's state."""
    if saved is None:
        return
    if isinstance(state, TopKState):
        state.load_state_dict(saved)
    elif isinstance(state, powerSGD_hook.PowerSGDState | post_localSGD_hook.PostLocalSGDState):
        state.iter = saved["iter"]


def _plain_momentum(optimizer) -> float:
    """SGD with one momentum > 0 and nothing that would make hook-side momentum differ."""
    if type(optimizer) is not torch.optim.SGD:
        return 0.0
    groups = optimizer.param_groups
    m = groups[0]["momentum"]
    plain = all(g["momentum"] == m and not g["nesterov"] and g["dampening"] == 0 and g["weight_decay"] == 0
                and not g.get("maximize", False) for g in groups)
    return m if plain and m > 0 else 0.0


def finish_optimizer(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> None:
    """At the end of training, average the model once more if the method lets replicas drift."""
    from torch.distributed.algorithms.model_averaging.utils import average_parameters
    from torch.distributed.optim import PostLocalSGDOptimizer

    if isinstance(optimizer, PostLocalSGDOptimizer):
        average_parameters(iter(list(model.parameters())), optimizer.averager.process_group)


# ---------------------------------------------------------------------------------------------
# choosing a method from the profile

# Tuned with `hetflow bench comm` (wide_mlp, 4 ranks, 2 cores): see choose_compression.
COMPRESS_ABOVE = 0.40


def choose_compression(comm_share: float, threshold: float = COMPRESS_ABOVE) -> tuple[str, str]:
    """'auto': compress only when communication is a large share of the step; say why.

    `comm_share` is the profiled all-reduce time of one gradient over (compute + all-reduce).
    Below `threshold` nothing is compressed: the saving is at most that share and compression
    costs compute and some accuracy. From there on PowerSGD rank 4 (>= 8x fewer bytes,
    accuracy close to none in `hetflow bench comm`).
    """
    if comm_share < threshold:
        method, reason = "none", (
            f"measured communication is {comm_share:.0%} of the step (< {threshold:.0%}): "
            "compression would cost compute and accuracy for little time"
        )
    else:
        method, reason = "powersgd:4", (
            f"communication is {comm_share:.0%} of the step (>= {threshold:.0%}): "
            "PowerSGD rank 4 cuts the bytes by >8x"
        )
    log.info("compression 'auto' -> %s: %s", method, reason)
    return method, reason
