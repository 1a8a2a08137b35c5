"""What 'best' means for `hetflow recommend` (`rent.search`): the objective, its
order of mixes and why a mix loses to the chosen one, and the Pareto front of time and cost
(pure; a mix is a `mix.Prediction`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hetflow.forecast.rent.mix import Prediction


@dataclass(frozen=True)
class Objective:
    """What 'best' means: the least cost ('cost'), the least cost predicted to finish by
    (1 - `margin`) x `deadline_h` ('deadline'), the least time within `budget_usd` ('budget')."""

    kind: str = "cost"
    deadline_h: float | None = None
    budget_usd: float | None = None
    margin: float = 0.0  # the CLI, the flow and the bench: `hetflow.config.DEADLINE_MARGIN`

    @property
    def planned_h(self) -> float | None:
        """The hours a mix must be predicted to finish in: the deadline less its margin."""
        return None if self.deadline_h is None else self.deadline_h * (1 - self.margin)

    def feasible(self, p: Prediction) -> bool:
        if self.kind == "deadline":
            return p.hours <= self.planned_h
        if self.kind == "budget":
            return p.cost_usd <= self.budget_usd
        return True

    def key(self, p: Prediction) -> tuple:
        """Smaller is better; an infeasible mix sorts after every feasible one."""
        main = (p.hours, p.cost_usd) if self.kind == "budget" else (p.cost_usd, p.hours)
        return (not self.feasible(p), *main, p.types(), sum(p.counts), p.market != "on-demand")

    def why_loses(self, p: Prediction, best: Prediction) -> str:
        """Why `p` is not `best`, in a few words."""
        if self.kind == "deadline" and not self.feasible(p):
            if p.bare_hours <= self.planned_h:  # spot: only interruptions make it late
                return (
                    f"misses the deadline less its margin with {p.interruptions:.2g} "
                    f"interruptions ({p.hours:.3g} > {self.planned_h:.3g} h; "
                    f"{p.bare_hours:.3g} h without)"
                )
            return f"misses the deadline less its margin ({p.hours:.3g} > {self.planned_h:.3g} h)"
        if self.kind == "budget" and not self.feasible(p):
            return f"over the budget (${p.cost_usd:,.2f} > ${self.budget_usd:,.2f})"
        if self.kind == "budget":
            return f"takes {p.hours / best.hours:.2f}x as long" if p.hours > best.hours else "ties"
        if p.cost_usd > best.cost_usd * (1 + 1e-9):
            return f"costs {p.cost_usd / best.cost_usd:.2f}x"
        return "same cost, more instances or slower"


def pareto(preds: Iterable[Prediction]) -> list[Prediction]:
    """The mixes no other mix beats on both time and cost, fastest first."""
    front: list[Prediction] = []
    for p in sorted(preds, key=lambda p: (p.hours, p.cost_usd)):
        if not front or p.cost_usd < front[-1].cost_usd:
            front.append(p)
    return front


def by_hours(p: Prediction) -> tuple:
    return (p.hours, p.cost_usd, sum(p.counts))


def by_cost(p: Prediction) -> tuple:
    return (p.cost_usd, p.hours, sum(p.counts))
