"""Local SGD and hierarchical averaging: the DDP comm-hook states (torch's
`post_localSGD_hook`) and `SampleWeightedAverager`, torch's periodic model averager weighted by
the samples each rank trained on. `methods.METHODS` registers them as `localsgd` and
`hierarchical`.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.distributed.algorithms.model_averaging.utils import get_params_to_average

from hetflow.records import CompressionMethod
from hetflow.training.comm.accounting import add_intra_node_group

if TYPE_CHECKING:
    from hetflow.training.comm.setup import Setup


def build_localsgd(ddp, method: CompressionMethod, setup: Setup):
    state = post_localSGD_hook.PostLocalSGDState(
        process_group=None,
        subgroup=None,
        start_localSGD_iter=setup.warmup_steps,
        post_local_gradient_allreduce=False,
    )
    return state, post_localSGD_hook.post_localSGD_hook


def _node_groups(nodes: list[str]) -> list[list[int]]:
    order: dict[str, list[int]] = {}
    for rank, node in enumerate(nodes):
        order.setdefault(node, []).append(rank)
    return list(order.values())


def build_hierarchical(ddp, method: CompressionMethod, setup: Setup):
    """Gradients all-reduced inside each node every step (a per-node subgroup, counted as
    intra-node traffic), the model averaged across nodes every `period` steps."""
    nodes = setup.nodes
    if nodes is None:
        raise ValueError(
            "train.compression: hierarchical averaging needs the node of every worker "
            "(register_compression(..., nodes=[w.node for w in cluster.workers]))"
        )
    if len(nodes) != dist.get_world_size():
        raise ValueError(
            f"cluster.workers.node: {len(nodes)} nodes for {dist.get_world_size()} ranks"
        )
    subgroup, _ = dist.new_subgroups_by_enumeration(_node_groups(nodes))
    add_intra_node_group(subgroup)
    state = post_localSGD_hook.PostLocalSGDState(
        process_group=None,
        subgroup=subgroup,
        start_localSGD_iter=setup.warmup_steps,
        post_local_gradient_allreduce=True,
    )
    return state, post_localSGD_hook.post_localSGD_hook


class SampleWeightedAverager(PeriodicModelAverager):
    """torch's `PeriodicModelAverager` (every `period` steps once `warmup_steps` are done, as
    `PostLocalSGDOptimizer` calls it after each optimizer step), averaging the ranks' parameters
    weighted by the samples each trained on, not equally.

    Contract: at an average, rank r's parameters weigh s_r / S, s_r the samples it stepped on
    since the replicas were last equal (the last average, or the warm-up's last step, whose
    gradient was all-reduced) and S every rank's (each step's global batch, summed): a rank the
    plan left out throughout (batch 0) weighs 0, whatever its optimizer did. Each step's
    samples are noted with `trained` before the optimizer's step; with none noted it averages
    equally. Between averages a rank steps on the mean loss of its own batch (`loss_scale`;
    with hierarchical averaging, of its node's), so that period 1 is synchronous SGD on the
    global batch's mean. No collective is added: every rank knows each step's global batch.
    """

    def __init__(
        self, period: int, warmup_steps: int, rank: int, mates: list[int], process_group=None
    ) -> None:
        super().__init__(period=period, warmup_steps=warmup_steps, process_group=process_group)
        self.rank, self.mates = rank, list(mates)  # mates: the ranks whose gradients it shares
        self.samples = self.total = 0  # this rank's and every rank's, since replicas were equal
        self.apart = 0  # steps since the replicas were equal

    def local(self) -> bool:
        """Whether the next optimizer step is local: its gradient not all-reduced over every
        rank (`post_localSGD_hook` after the same warm-up)."""
        return self.step >= self.warmup_steps

    def loss_scale(self, count: int, plan: list[int]) -> float:
        """What a local step multiplies this rank's summed loss (over `count`) by, under the
        local batches `plan`: 1 / count with local SGD (its own mean); with hierarchical
        averaging, whose intra-node all-reduce averages over the node's k ranks, k x n_r /
        (n_node x count), so that the node steps on the mean over its samples. 0 without
        samples."""
        node = sum(plan[r] for r in self.mates)
        if count <= 0 or node <= 0:
            return 0.0
        return len(self.mates) * plan[self.rank] / (node * count)

    def trained(self, samples: int, total: int) -> None:
        """Note a step: this rank's `samples`, of the step's global batch `total`."""
        self.samples += samples
        self.total += total

    def average_parameters(self, params) -> None:
        if self.step < self.warmup_steps:  # the gradient was all-reduced: replicas equal
            self.samples = self.total = 0
        elif (self.step - self.warmup_steps) % self.period == 0:
            self.average_now(get_params_to_average(params))  # torch's: those with a gradient
        else:
            self.apart += 1
        self.step += 1

    def average_now(self, params) -> None:
        """Average the tensors `params` over every rank now, weighted."""
        weight = self.samples / self.total if self.total else None
        self._average(list(params), weight)
        self.samples = self.total = self.apart = 0

    def _average(self, params: list, weight: float | None) -> None:
        """Every rank's `params`, each rank's times its `weight` (None: 1 / world), summed:
        one all-reduce of the parameters, as torch's `average_parameters`."""
        group = self.process_group
        if weight is None:
            weight = 1.0 / dist.get_world_size(group)
        flat = torch.cat([p.data.reshape(-1) for p in params])
        flat *= weight
        if torch.accelerator.is_available():  # as torch: no clash with work in flight
            torch.accelerator.synchronize()
        dist.all_reduce(flat, group=group)
        offset = 0
        for p in params:
            p.data = flat[offset : offset + p.numel()].view_as(p).type_as(p)
            offset += p.numel()


def averaging_optimizer(optimizer, method: CompressionMethod, state):
    """Local SGD averages the model every `period` steps, after the optimizer's step, each
    rank weighted by its samples (`SampleWeightedAverager`)."""
    from torch.distributed.optim import PostLocalSGDOptimizer

    rank = dist.get_rank()
    mates = dist.get_process_group_ranks(state.subgroup) if state.subgroup else [rank]
    with warnings.catch_warnings():  # period 1 is allowed (it is plain synchronous SGD)
        warnings.simplefilter("ignore")
        averager = SampleWeightedAverager(
            method.period, state.start_localSGD_iter, rank, sorted(mates)
        )
    return PostLocalSGDOptimizer(optimizer, averager)


def local_averager(optimizer) -> SampleWeightedAverager | None:
    """The averager of an optimizer `wrap_optimizer` wrapped for local SGD or hierarchical
    averaging; None for the other methods."""
    return getattr(optimizer, "averager", None)
