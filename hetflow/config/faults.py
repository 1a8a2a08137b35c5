"""The failure policy: who retries what after a failure, how many times and after how long.

One model, `FaultPolicy`, set as `TrainConfig.faults` (YAML `train: {faults: {...}}`, or a
deployment run's parameters), read by every layer that retries:

- a rank: never retried alone. A rank that raises, or meets a NaN/Inf gradient under
  `nonfinite: fail`, ends the job at once (the error would come back); a data-parallel group
  cannot go on with one rank replaced, so the launcher restarts the whole group instead.
- the group: the launcher restarts every rank from the last checkpoint when a worker process
  dies, stalls past `TrainConfig.stall_timeout_s` or is preempted, or (under Ray) its node is
  lost, at most `group_restarts` times: torchrun's `--max-restarts`
  (`training.launch.local`), Ray Train's `FailureConfig(max_failures)`
  (`training.launch.ray_train`). Both restart at once: neither launcher has a delay.
- a worker lost with `on_loss: continue` (the local launcher, strategy ddp): no restart; the
  other ranks form a new group without it and go on from the step they were at
  (`training.elastic`), while at least `min_workers` are left; a worker can also join it in
  place: one that starts late (`join_at`), a replacement for a lost one (`replace`), one
  added when asked (`spare`: the queue's workers a job may grow onto), on a warm worker the
  launcher keeps (`warm_workers`).
- under Ray, a lost node with no replacement: Ray Train tries `placement_tries` times to place
  the restarted group; then the run goes on without that node's workers
  (`go_on_without`), or fails where that is off.
- the Prefect task: where the launch itself is lost (the launcher's restarts spent, its
  process killed, past its deadline), Prefect runs the `train` task again `task_retries` times,
  `task_retry_delay_s` after the failure, in the same run directory: the workers resume from
  the last checkpoint. Bad input and a rank's own exception are never retried.

The clients of S3 and MLflow keep their own retries (botocore's retry mode), outside this
policy; the storage tasks (ingest, the profile history) keep theirs on their decorators.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hetflow.config.base import ConfigModel


class FaultPolicy(ConfigModel):
    """Who retries what after a failure, how many times and after how long (see the module)."""

    group_restarts: int = Field(
        3,
        ge=0,
        title="Group restarts",
        description="How many times the launcher (torchrun, Ray Train) restarts every rank "
        "from the last checkpoint after a worker dies, stalls or its node is lost; 0: the "
        "first such failure ends the launch.",
    )
    placement_tries: int = Field(
        3,
        ge=1,
        title="Placement tries (Ray)",
        description="Under Ray: how many times Ray Train tries, each for its start timeout, "
        "to place a restarted group before the run goes on without the workers no node has "
        "room for.",
    )
    go_on_without: bool = Field(
        True,
        title="Go on without a lost node (Ray)",
        description="Under Ray: where no node of a lost worker's type comes back, go on "
        "without its workers (the global batch shared by the others); off: the run fails.",
    )
    task_retries: int = Field(
        1,
        ge=0,
        title="Train task retries (Prefect)",
        description="How many times Prefect runs the train task again when the launch is lost "
        "(restarts spent, the launcher killed): it resumes from the last checkpoint in the "
        "same run directory. Bad input and a rank's own exception are never retried.",
    )
    task_retry_delay_s: float = Field(
        5.0,
        ge=0,
        title="Train task retry delay (s)",
        description="Seconds Prefect waits before retrying the train task.",
    )
    on_loss: Literal["restart", "continue"] = Field(
        "restart",
        title="On a lost worker",
        description="'restart': the launcher restarts every rank from the last checkpoint "
        "(group_restarts). 'continue': the other ranks keep their processes and state, form a "
        "new group without it, re-plan the global batch over the workers left and go on from "
        "the step they were at (local launcher, strategy ddp, no stateful compression).",
    )
    collective_timeout_s: float = Field(
        3.0,
        gt=0,
        title="Collective timeout under 'continue' (s)",
        description="Under on_loss 'continue': how long a collective in the step loop waits "
        "before its rank asks who is left. A rank not next to the lost one in gloo's ring "
        "notices it only then; a timeout with nobody lost costs a regroup, not a step. Keep "
        "it above the longest wait of a healthy step (a slow peer, rank 0's evaluation); a "
        "rank silent for twice it and a second is left out as stalled.",
    )
    min_workers: int = Field(
        1,
        ge=1,
        title="Fewest workers under 'continue'",
        description="Under on_loss 'continue': with fewer workers left than this, the "
        "survivors checkpoint the step they reached and the job ends, stating so.",
    )
    join_at: dict[int, int] = Field(
        default_factory=dict,
        title="Workers that join late under 'continue'",
        description="Under on_loss 'continue': rank -> step. The launcher starts these "
        "workers of the cluster only once the job has done that many steps; each joins the "
        "running job in place when it is ready (the others' weights, optimizer and data "
        "position sent to it, the global batch re-cut over every worker). Rank 0 starts the "
        "job.",
    )
    warm_workers: int = Field(
        0,
        ge=0,
        title="Warm workers under 'continue'",
        description="Under on_loss 'continue': worker processes the launcher keeps started, "
        "torch imported, for workers added to the running job (besides one for each of "
        "join_at's), so that a join costs the state transfer, not a Python and torch start.",
    )
    spare: list[str] = Field(
        default_factory=list,
        title="Spare workers under 'continue'",
        description="Under on_loss 'continue': workers of the cluster (by name) the launcher "
        "does not start; each is a free slot that a worker joins in place only when the "
        "launcher API adds it (`add_worker`): the queue's workers a job may grow onto. At "
        "least one worker of the cluster starts the job.",
    )
    replace: bool = Field(
        False,
        title="Replace a lost worker under 'continue'",
        description="Under on_loss 'continue': the launcher starts a replacement for a worker "
        "that died or stalled (on a warm worker it keeps for it), which joins the running "
        "job in place in the lost worker's slot; at most group_restarts replacements in all.",
    )
