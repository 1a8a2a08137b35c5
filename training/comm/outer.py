"""The outer step of `strategy: diloco`: each rank's change over a round, weighted by its
samples, summed over the ranks, and applied to the shared weights by an outer SGD with
Nesterov momentum (DiLoCo, arXiv 2311.08105; the change as a pseudo-gradient).

Written on torch.distributed rather than taken from torchft (`torchft.local_sgd.DiLoCo`),
which lacks what this needs: it syncs every `sync_every` inner steps, the same count on every
replica, so a fast worker waits for the slowest; its all-reduce averages the replicas equally
(`Manager.allreduce` divides by the participants), not by the samples each trained on; it
needs its Manager and a lighthouse server for every quorum; and its quantized all-reduce is
triton kernels, CUDA only.
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.utils import parameters_to_vector

from hetflow.config import DiLoCoConfig

INT8_MAX = 127


@dataclass
class _InFlight:
    """A round's change on the wire: the collective's work, its buffer (or the gathered
    buffers), and this rank's own change that round (unweighted)."""

    work: object
    sent: object
    change: torch.Tensor


def _copy_into(flat: torch.Tensor, params: list[torch.nn.Parameter]) -> None:
    """`flat` copied into `params` in order, each keeping its own storage (torch's
    `vector_to_parameters` would make them views of `flat`)."""
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def encode_int8(x: torch.Tensor) -> torch.Tensor:
    """`x` (fp32, flat) as int8 after one fp32 scale (max |x| / 127) as its first 4 bytes.

    >>> x = torch.tensor([0.5, -1.0, 0.25])
    >>> torch.allclose(decode_int8(encode_int8(x)), x, atol=1 / 127)
    True
    """
    scale = x.abs().max().clamp_min(1e-30) / INT8_MAX
    q = torch.round(x / scale).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return torch.cat([scale.reshape(1).to(torch.float32).view(torch.int8), q])


def decode_int8(buf: torch.Tensor) -> torch.Tensor:
    """`encode_int8`'s buffer back as fp32."""
    scale = buf[:4].clone().view(torch.float32)
    return buf[4:].to(torch.float32) * scale


class OuterStep:
    """The shared weights (`anchor`, flat fp32), their outer SGD, and the rounds in flight.

    Contract: after `end_round(weight)` on every rank, with `weight` = this rank's samples
    that round / every rank's, and once the round is applied (at once with staleness 0, else
    `staleness` rounds later or at `drain`), the anchor has taken one outer SGD step on the
    pseudo-gradient -sum_r weight_r x change_r, change_r being rank r's parameters' change
    over the round: with outer lr 1 and momentum 0 the anchor is the sample-weighted average
    of the ranks' models. A rank with no samples (weight 0) still joins every collective.

    Bounded staleness s: a round's change goes out asynchronously at its end and is applied s
    rounds later; a rank blocks only on the collective s rounds old, which completes when the
    slowest rank has joined it, so a rank runs at most s rounds ahead of the slowest. When it
    lands, the rank's model becomes the new anchor plus its own changes still in flight
    (`_apply`): its local progress is kept, the anchor's step replaces its own stale change.
    `send`: fp32 or bf16 (one all-reduce of the weighted change) or int8 (`encode_int8`, one
    all-gather: int8 does not sum); the rounding error of bf16 and int8 is fed back into
    the next round's change (error feedback), so no part of a change is lost for good.
    """

    def __init__(self, params: list[torch.nn.Parameter], cfg: DiLoCoConfig, group=None) -> None:
        self.params = list(params)
        self.send, self.staleness, self.group = cfg.send, cfg.staleness, group
        flat = parameters_to_vector(self.params).detach().float()
        self.anchor = torch.nn.Parameter(flat.clone())
        self.outer = torch.optim.SGD(
            [self.anchor],
            lr=cfg.outer_lr,
            momentum=cfg.outer_momentum,
            nesterov=cfg.outer_momentum > 0,
        )
        self.start = flat.clone()  # this rank's model when its current round began
        self.residual = torch.zeros_like(flat)  # what encoding dropped (error feedback)
        self.in_flight: deque[_InFlight] = deque()
        self.rounds = 0  # rounds applied to the anchor

    @property
    def apart(self) -> int:
        """Rounds sent and not yet applied: the ranks' models may differ while any are."""
        return len(self.in_flight)

    def end_round(self, weight: float) -> None:
        """Send this rank's change since the round began, times `weight`; apply the rounds
        older than `staleness` (blocking on their collectives)."""
        flat = parameters_to_vector(self.params).detach().float()
        change = flat - self.start
        self.start = flat
        self.in_flight.append(_InFlight(*self._issue(change * weight), change))
        while len(self.in_flight) > self.staleness:
            self._apply(self.in_flight.popleft())

    def drain(self) -> None:
        """Apply every round in flight: afterwards every rank holds the anchor."""
        while self.in_flight:
            self._apply(self.in_flight.popleft())

    def _issue(self, x: torch.Tensor) -> tuple[object, object]:
        x = x + self.residual
        if self.send == "int8":
            buf = encode_int8(x)
            self.residual = x - decode_int8(buf)
            world = dist.get_world_size(self.group)
            out = [torch.empty_like(buf) for _ in range(world)]
            return dist.all_gather(out, buf, group=self.group, async_op=True), out
        buf = x.to(torch.bfloat16) if self.send == "bf16" else x.clone()
        self.residual = x - buf.float() if self.send == "bf16" else torch.zeros_like(x)
        return dist.all_reduce(buf, group=self.group, async_op=True), buf

    def _collect(self, flight: _InFlight) -> torch.Tensor:
        flight.work.wait()
        if isinstance(flight.sent, list):
            return torch.stack([decode_int8(b) for b in flight.sent]).sum(0)
        return flight.sent.float()

    def _apply(self, flight: _InFlight) -> None:
        """The outer step on one round's summed change; this rank's model (and the start of
        its current round) moved by the anchor's step less its own change that round."""
        total = self._collect(flight)
        before = self.anchor.detach().clone()
        self.anchor.grad = -total
        self.outer.step()
        self.outer.zero_grad(set_to_none=True)
        shift = self.anchor.detach() - before - flight.change
        local = parameters_to_vector(self.params).detach().float() + shift
        self.start += shift
        _copy_into(local, self.params)
        self.rounds += 1

    def state_dict(self) -> dict:
        """The anchor, the outer optimizer's momentum, the residual and the rounds applied.
        Rounds in flight are not kept: a resume starts every rank from the anchor, and the
        changes of at most `staleness` rounds are trained again."""
        return {
            "anchor": self.anchor.detach().clone(),
            "outer": copy.deepcopy(self.outer.state_dict()),  # torch's holds live tensors
            "residual": self.residual.clone(),
            "rounds": self.rounds,
        }

    def load_state_dict(self, saved: dict) -> None:
        """`state_dict`'s output: the model, the anchor and the round's start all the saved
        anchor, nothing in flight."""
        with torch.no_grad():
            self.anchor.copy_(saved["anchor"])
        _copy_into(self.anchor.detach(), self.params)
        self.outer.load_state_dict(saved["outer"])
        self.residual = saved["residual"].clone()
        self.rounds = saved["rounds"]
        self.start = self.anchor.detach().clone()
        self.in_flight.clear()
