"""The gradient-communication methods by name: a registry, `METHODS`, whose entries say how to
build each method's DDP comm hook and its state, its warm-up, what it does to the optimizer and
what a checkpoint keeps of its state. The public functions take a parsed `CompressionMethod`
(never 'auto', which the planner resolves first).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.distributed.algorithms.ddp_comm_hooks import (
    default_hooks,
    post_localSGD_hook,
    powerSGD_hook,
)

from hetflow.records import CompressionMethod
from hetflow.training.comm.averaging import (
    averaging_optimizer,
    build_hierarchical,
    build_localsgd,
    local_averager,
)
from hetflow.training.comm.setup import DENSE_WARMUP_STEPS, Setup
from hetflow.training.comm.topk import (
    DENSITY_STAGE_STEPS,
    TopKState,
    topk_hook,
    topk_warmup_steps,
)


def _same_optimizer(optimizer, method: CompressionMethod, state):
    return optimizer


def _no_warmup(method: CompressionMethod, setup: Setup) -> int:
    return 0


def _dense_warmup(method: CompressionMethod, setup: Setup) -> int:
    return setup.warmup_steps


@dataclass(frozen=True)
class MethodEntry:
    """One registry entry.

    `build(ddp, method, setup) -> (state, hook)`; `warmup(method, setup)`: steps before the
    method sends as it will for the rest of the run; `optimizer(optimizer, method, state)`: the
    optimizer the method needs; `state_type`: the class of its state (None: stateless), whose
    checkpointed part `save(state)` returns and `load(state, saved)` restores.
    """

    build: Callable
    warmup: Callable[[CompressionMethod, Setup], int] = _dense_warmup
    optimizer: Callable = _same_optimizer
    state_type: type | None = None
    save: Callable[[object], dict] | None = None
    load: Callable[[object, dict], None] | None = None


# -- hooks ------------------------------------------------------------------------------------


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


@dataclass
class GroupRef:
    """The state of the hooks that keep none between steps (none, fp16, bf16): the process
    group their all-reduce runs on, None for every rank. torch's hooks take the group itself
    as their state, fixed once registered; through this the training loop moves the all-reduce
    onto the ranks a plan gives samples to (`training.computing.ComputingRanks`)."""

    group: object = None


def _stateless(hook) -> Callable:
    def on_group(ref, bucket):  # see _bf16_hook
        return hook(ref.group, bucket)

    return lambda ddp, method, setup: (GroupRef(), on_group)


def _stateful_warmup(warmup_steps: int) -> int:
    """Dense steps before PowerSGD or top-k compress: at least 2, since DDP rebuilds its buckets
    after the first step, which would scramble their per-bucket state (residuals, factors)."""
    return max(2, warmup_steps)


# -- PowerSGD ---------------------------------------------------------------------------------


def _build_powersgd(ddp, method: CompressionMethod, setup: Setup):
    state = powerSGD_hook.PowerSGDState(
        process_group=None,
        matrix_approximation_rank=method.rank,
        start_powerSGD_iter=_stateful_warmup(setup.warmup_steps),
        min_compression_rate=1,
        use_error_feedback=True,
        warm_start=True,
        random_seed=0,
    )
    return state, _powersgd_hook


def _save_iter(state) -> dict:
    """The step counter only, so that a resumed run does not warm up again. PowerSGD's error
    feedback and warm-start factors are keyed by bucket position, which a new DDP instance
    re-orders after its first step, so they start again from zero; local SGD's model averager
    is in its optimizer's state."""
    return {"iter": state.iter}


def _load_iter(state, saved: dict) -> None:
    state.iter = saved["iter"]


# -- top-k ------------------------------------------------------------------------------------


def _build_topk(ddp, method: CompressionMethod, setup: Setup):
    state = TopKState(
        method.ratio,
        warmup_steps=_stateful_warmup(setup.warmup_steps),
        params=list(ddp.module.parameters()),
        stage_steps=setup.density_stage_steps,
    )
    return state, topk_hook


def _topk_warmup(method: CompressionMethod, setup: Setup) -> int:
    warmup = _stateful_warmup(setup.warmup_steps)
    return topk_warmup_steps(method.ratio, warmup, setup.density_stage_steps)


def _plain_momentum(optimizer) -> float:
    """SGD with one momentum > 0 and nothing that would make hook-side momentum differ."""
    if type(optimizer) is not torch.optim.SGD:
        return 0.0
    groups = optimizer.param_groups
    m = groups[0]["momentum"]
    plain = all(
        g["momentum"] == m
        and not g["nesterov"]
        and g["dampening"] == 0
        and g["weight_decay"] == 0
        and not g.get("maximize", False)
        for g in groups
    )
    return m if plain and m > 0 else 0.0


def _topk_optimizer(optimizer, method: CompressionMethod, state):
    """The hook takes over plain SGD momentum once compression starts (see `topk_hook`). At
    ratio 1 everything is sent and nothing is left to correct: SGD keeps its momentum."""
    momentum = _plain_momentum(optimizer)
    if isinstance(state, TopKState) and momentum and state.ratio < 1:
        state.optimizer, state.momentum = optimizer, momentum
    return optimizer


# -- the registry -----------------------------------------------------------------------------

_AVERAGING = {
    "warmup": _dense_warmup,
    "optimizer": averaging_optimizer,
    "state_type": post_localSGD_hook.PostLocalSGDState,
    "save": _save_iter,
    "load": _load_iter,
}

METHODS: dict[str, MethodEntry] = {
    "none": MethodEntry(_stateless(default_hooks.allreduce_hook), warmup=_no_warmup),
    "fp16": MethodEntry(_stateless(default_hooks.fp16_compress_hook), warmup=_no_warmup),
    "bf16": MethodEntry(_stateless(_bf16_hook), warmup=_no_warmup),
    "powersgd": MethodEntry(
        _build_powersgd,
        lambda m, s: _stateful_warmup(s.warmup_steps),
        state_type=powerSGD_hook.PowerSGDState,
        save=_save_iter,
        load=_load_iter,
    ),
    "topk": MethodEntry(
        _build_topk,
        _topk_warmup,
        _topk_optimizer,
        state_type=TopKState,
        save=TopKState.state_dict,
        load=TopKState.load_state_dict,
    ),
    "localsgd": MethodEntry(build_localsgd, **_AVERAGING),
    "hierarchical": MethodEntry(build_hierarchical, **_AVERAGING),
}


# -- public -----------------------------------------------------------------------------------


def _entry(method: CompressionMethod) -> MethodEntry:
    if not isinstance(method, CompressionMethod):  # e.g. the text form, parsed nowhere here
        raise TypeError(f"a CompressionMethod is needed (CompressionMethod.parse), not {method!r}")
    return METHODS[method.name]


def method_warmup_steps(
    method: CompressionMethod,
    warmup_steps: int = DENSE_WARMUP_STEPS,
    density_stage_steps: int = DENSITY_STAGE_STEPS,
) -> int:
    """Steps before `method` sends as it will for the rest of the run (its warm-up), as
    `register_compression` sets it up: 0 for none/fp16/bf16, which compress from step 0."""
    setup = Setup(warmup_steps=warmup_steps, density_stage_steps=density_stage_steps)
    return _entry(method).warmup(method, setup)


def register_compression(
    ddp: torch.nn.parallel.DistributedDataParallel,
    method: CompressionMethod,
    hook_wrapper=lambda hook: hook,
    *,
    nodes: list[str] | None = None,
    warmup_steps: int = DENSE_WARMUP_STEPS,
    density_stage_steps: int = DENSITY_STAGE_STEPS,
):
    """Attach the comm hook for `method`, wrapped by `hook_wrapper(hook)`.

    `nodes[r]` names the node of rank r (needed by `hierarchical:H`). `density_stage_steps`:
    top-k's density warm-up (`topk_density`; 0: none). Returns the hook's state; pass it to
    `wrap_optimizer`, `comm_state_dict` and `load_comm_state`.
    """
    setup = Setup(nodes=nodes, warmup_steps=warmup_steps, density_stage_steps=density_stage_steps)
    state, hook = _entry(method).build(ddp, method, setup)
    ddp.register_comm_hook(state, hook_wrapper(hook))
    return state


def wrap_optimizer(
    optimizer: torch.optim.Optimizer, method: CompressionMethod, state
) -> torch.optim.Optimizer:
    """The optimizer `method` needs, given the state `register_compression` returned: local SGD
    and hierarchical averaging wrap it (PostLocalSGDOptimizer), top-k takes over plain SGD
    momentum, the others return it unchanged."""
    return _entry(method).optimizer(optimizer, method, state)


def _entry_for_state(state) -> MethodEntry | None:
    for entry in METHODS.values():
        if entry.state_type is not None and isinstance(state, entry.state_type):
            return entry
    return None


def comm_state_dict(state) -> dict | None:
    """What a checkpoint keeps of a comm hook's state (`register_compression`'s return); None
    for the stateless hooks. Top-k keeps everything (see `TopKState.state_dict`); PowerSGD and
    local SGD keep their step counter (see `_save_iter`)."""
    entry = _entry_for_state(state)
    return entry.save(state) if entry is not None else None


def load_comm_state(state, saved: dict | None) -> None:
    """Restore `comm_state_dict`'s output into a freshly registered hook's state."""
    entry = _entry_for_state(state)
    if saved is not None and entry is not None:
        entry.load(state, saved)


def finish_optimizer(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> None:
    """At the end of training, average the model once more if the method lets replicas drift
    and they did since the last average (weighted by samples: `SampleWeightedAverager`). A
    collective of every rank where it averages; nothing otherwise."""
    averager = local_averager(optimizer)
    if averager is not None and averager.apart:
        averager.average_now(model.parameters())
