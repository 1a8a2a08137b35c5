"""What a user writes to queue training jobs on one cluster (`hetflow queue submit`, the
`queue` flow's form): each job's priority class, what it trains and how much memory one
worker must have to hold it."""

from __future__ import annotations

import math
import re
from typing import Literal

from pydantic import Field, field_validator

from hetflow.config.base import RECIPE_ALIASES, RECIPE_DESCRIPTION, RECIPE_PATTERN, ConfigModel
from hetflow.config.cluster import ClusterSpec
from hetflow.config.train import TrainConfig
from hetflow.emulation.presets import PRESETS

# The priority classes, highest first (`hetflow.queue.jobs.PRIORITIES` weighs them).
PRIORITY_CLASSES = ("high", "normal", "low")
# How a session gives out workers: the allocator (`hetflow.queue.switch.decide`, the default)
# or first come, first served blind to the device type (`hetflow.queue.fifo`, the baseline).
QUEUE_POLICIES = ("allocator", "fifo")


JOB_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"

# How a job of the queue ends: its last step done, a failure of its own (the others go on),
# or `hetflow queue cancel` (taken out before it started, or stopped at a checkpoint).
ENDED_STATES = ("done", "failed", "cancelled")
# `$HETFLOW_HOME/queue/CANCEL_FOLDER/NAME`: `hetflow queue cancel NAME`'s request to the
# running session (an empty file; the session removes it once read).
CANCEL_FOLDER = "cancel"


class QueueJob(ConfigModel):
    """One training job of the queue: a train run with a priority, run in segments of
    `checkpoint_every` steps (the queue moves its workers only at a checkpoint)."""

    name: str = Field(
        pattern=JOB_NAME,
        title="Name",
        description="Unique in the queue: letters, digits, '.', '_' and '-'.",
    )
    priority: Literal["high", "normal", "low"] = Field(
        "normal",
        title="Priority class",
        description="'high' takes workers from lower classes at their next checkpoint.",
    )
    recipe: str = Field(
        "digits-cnn", title="Recipe", description=RECIPE_DESCRIPTION, pattern=RECIPE_PATTERN
    )
    steps: int = Field(60, ge=1, title="Optimizer steps", description="The job's length, in steps.")
    global_batch: int = Field(128, ge=1, title="Global batch", description="Samples per step.")
    checkpoint_every: int = Field(
        20,
        ge=1,
        title="Checkpoint every N steps",
        description="The queue moves or stops the job only here: a higher-priority arrival "
        "waits at most this many of its steps.",
    )
    memory_gb: float = Field(
        0.5,
        gt=0,
        title="Memory a worker needs (GB)",
        description="What one worker must hold (parameters, gradients, optimizer state, one "
        "micro-batch); a worker with less never gets the job.",
    )
    arrive_after_s: float = Field(
        0.0, ge=0, title="Arrives after (s)", description="Seconds after the queue starts."
    )
    workers: int | None = Field(
        None,
        ge=1,
        title="Workers it asks for (fifo)",
        description="Under the fifo policy, the job waits for this many free workers and takes "
        "the first ones in the cluster's order; empty: every worker that holds it. The "
        "allocator chooses for itself.",
    )
    in_place: bool = Field(
        False,
        title="Moves in place",
        description="Run the job elastic (`faults.on_loss: continue`): a worker the queue "
        "takes from it leaves at its next step boundary while the others go on, and one it "
        "gives it joins at a step boundary, no relaunch, no wait for a checkpoint (moved "
        "wholly to other workers, it takes them first, then lets its own go). Off: each move "
        "stops the job at its next checkpoint and relaunches it.",
    )

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, v):
        """The pattern, said in words (it also stands in the form's schema)."""
        if isinstance(v, str) and not re.match(JOB_NAME, v):
            raise ValueError(
                "a job name is letters, digits, '.', '_' and '-', starting with a letter or a digit"
            )
        return v

    @field_validator("recipe")
    @classmethod
    def _one_name_per_network(cls, v: str) -> str:
        return RECIPE_ALIASES.get(v, v)  # recommend's name of the network (`alias_note`)

    def train_config(self) -> TrainConfig:
        """The train run of each segment, but its steps (the segment's end)."""
        return TrainConfig(
            recipe=self.recipe,
            steps=self.steps,
            global_batch=self.global_batch,
            checkpoint_every=self.checkpoint_every,
            eval_every=self.checkpoint_every,
            schedule="dynamic",
            compression="none",
            faults={"on_loss": "continue" if self.in_place else "restart"},
        )


def worker_memory_gb(cluster: ClusterSpec, i: int) -> float:
    """Worker i's memory: its device preset's; unbounded (inf) for a worker without one (a
    CPU worker's memory is the host's, which every job here fits)."""
    preset = cluster.workers[i].preset
    return float(PRESETS[preset].memory_gib) if preset else math.inf


def queue_cluster() -> ClusterSpec:
    """The queue's default cluster: six emulated workers of three kinds (two each of the
    t4, v100 and a100 presets)."""
    return ClusterSpec.from_speeds(["t4", "t4", "v100", "v100", "a100", "a100"], name="queue-6")
