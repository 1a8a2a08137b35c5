"""Gradient communication: DDP comm hooks by method and wire-byte accounting.

Methods (a `CompressionMethod`, parsed from `TrainConfig.compression`), registered by name in
`methods.METHODS`:

- `none`, `fp16`, `bf16`: torch's `default_hooks` (all-reduce of fp32 / fp16 / bf16 buckets);
- `powersgd:R`: torch's `powerSGD_hook` (rank R, error feedback, warm start);
- `topk:RATIO`: sparsification with error feedback (`topk`): each rank keeps a residual per
  bucket, sends the RATIO largest-magnitude entries of gradient + residual (values and int32
  indices in one all-gather) and keeps the rest;
- `localsgd:H`: torch's `post_localSGD_hook` without gradient synchronization plus
  `PostLocalSGDOptimizer` / `PeriodicModelAverager`: the model is averaged every H steps;
- `hierarchical:H`: gradients are all-reduced inside each node (`WorkerSpec.node`) every step
  (`post_localSGD_hook` with a per-node subgroup) and the model is averaged across nodes every H
  steps. Traffic inside a node does not cross the emulated network link and is counted apart.

Every compressing method runs plain all-reduce for its first `DENSE_WARMUP_STEPS` steps
(`method_warmup_steps` gives the steps until a method sends as it will for the rest of the run).

Bytes are counted where every collective passes (`accounting.WireCounter`): a ring all-reduce
of B bytes over n ranks sends 2(n-1)/n x B from each rank, an all-gather of a B-byte
contribution (n-1) x B.

Rooms: `accounting` (bytes, process groups), `topk` (the top-k hook), `methods` (the registry,
registering a method on a DDP model, its optimizer and checkpointed state). Which method to
use ('auto': its candidates, the choice from their trials) is planning:
`hetflow.training.plan.compression`.
"""

from hetflow.training.comm.accounting import (
    WireCounter,
    allgather_bytes,
    new_control_group,
    ring_allreduce_bytes,
)
from hetflow.training.comm.methods import (
    DENSE_WARMUP_STEPS,
    METHODS,
    GroupRef,
    comm_state_dict,
    finish_optimizer,
    load_comm_state,
    method_warmup_steps,
    register_compression,
    wrap_optimizer,
)
from hetflow.training.comm.topk import (
    DENSITY_STAGE_STEPS,
    TopKState,
    decode_topk_into,
    encode_topk,
    select_topk,
    topk_count,
    topk_density,
    topk_hook,
    topk_warmup_steps,
)

__all__ = [
    "DENSE_WARMUP_STEPS",
    "DENSITY_STAGE_STEPS",
    "METHODS",
    "GroupRef",
    "TopKState",
    "WireCounter",
    "allgather_bytes",
    "comm_state_dict",
    "decode_topk_into",
    "encode_topk",
    "finish_optimizer",
    "load_comm_state",
    "method_warmup_steps",
    "new_control_group",
    "register_compression",
    "ring_allreduce_bytes",
    "select_topk",
    "topk_count",
    "topk_density",
    "topk_hook",
    "topk_warmup_steps",
    "wrap_optimizer",
]
