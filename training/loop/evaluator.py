"""The training loop's evaluator: rank 0 evaluates the model on the test split every
`eval_every` steps and at the run's end, and records the point on the loop's state."""

from __future__ import annotations

import torch.distributed as dist

from hetflow.infra.data.reader import RankData
from hetflow.records import EvalPoint
from hetflow.training.devices import to_device
from hetflow.training.launch.spec import RunSpec, since_submit
from hetflow.training.loop.net import Net
from hetflow.training.loop.state import LoopState
from hetflow.training.recipes import Recipe, evaluate


class Evaluator:
    """Rank 0's evaluation of `net` (the recipe's figures on `data`'s test split), stamped with
    the steps done, the training time and the seconds since the run's submission."""

    def __init__(self, spec: RunSpec, rank: int, net: Net, recipe: Recipe, data: RankData) -> None:
        self.spec = spec
        self.rank = rank
        self.net = net
        self.group = None  # the group its barrier runs on (None: every rank's)
        self.recipe = recipe
        self.data = data

    def evaluate(self, step: int, state: LoopState) -> None:
        """Rank 0 evaluates on the test split (under fsdp on the weights every rank gathers for
        it) and appends the point to `state.evals`; every rank waits for it, outside the timed
        step."""
        model = self.net.evaluation_model(self.rank)
        if self.rank == 0:
            # batches no larger than the training's: evaluation needs no more memory than a step
            recipe = self.recipe
            batches = (
                to_device(recipe.batch(x, y), self.net.device)
                for x, y in self.data.eval_batches(batch=max(state.plan))
            )
            figures = evaluate(recipe, model, batches)
            wall = since_submit(self.spec)
            state.evals.append(EvalPoint.of(step, state.train_time_s, figures, wall))
        dist.barrier(group=self.group)  # the others wait here, outside the timed step
