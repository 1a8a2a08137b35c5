"""What a compression method is built with besides its name (`Setup`): the node of each rank
and the warm-up's lengths. Its own module so that the method registry (`methods`) and the
builders it registers (`averaging`) both name it without importing each other."""

from __future__ import annotations

from dataclasses import dataclass

from hetflow.training.comm.topk import DENSITY_STAGE_STEPS

# Steps of plain all-reduce before a compressing method compresses (torch's
# `start_powerSGD_iter` / `start_localSGD_iter`): early gradients are the most sensitive to
# compression error.
DENSE_WARMUP_STEPS = 10


@dataclass(frozen=True)
class Setup:
    """What `register_compression` knows besides the method: `nodes[r]` the node of rank r
    (None if unknown), the dense warm-up and top-k's density stage length (0: no stages)."""

    nodes: list[str] | None = None
    warmup_steps: int = DENSE_WARMUP_STEPS
    density_stage_steps: int = DENSITY_STAGE_STEPS
