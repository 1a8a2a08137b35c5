"""Gradient communication: DDP comm hooks by method and wire-byte accounting.

Methods (a `CompressionMethod`, parsed from `TrainConfig.compression`), registered by name in
`methods.METHODS`: `none`, `fp16`, `bf16`, `powersgd:R` (torch's hooks), `topk:RATIO` (error
feedback), `localsgd:H`, `hierarchical:H` (model averaging every H steps); what each sends:
docs/concepts.md. Each compressing method runs plain all-reduce for its first
`DENSE_WARMUP_STEPS` steps (`method_warmup_steps`). `accounting.WireCounter` counts every
collective's bytes (a ring all-reduce of B bytes over n ranks: 2(n-1)/n x B from each rank).

Rooms: `accounting` (bytes, process groups), `topk` (the top-k hook), `methods` (the registry,
registering a method on a DDP model, its optimizer and checkpointed state). Which method to
use ('auto') is planning: `hetflow.training.plan.compression`.
"""

from hetflow.training.comm.accounting import (
    WireCounter,
    allgather_bytes,
    new_control_group,
    ring_allreduce_bytes,
)
from hetflow.training.comm.averaging import SampleWeightedAverager, local_averager
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
    "SampleWeightedAverager",
    "TopKState",
    "WireCounter",
    "allgather_bytes",
    "comm_state_dict",
    "decode_topk_into",
    "encode_topk",
    "finish_optimizer",
    "load_comm_state",
    "local_averager",
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
