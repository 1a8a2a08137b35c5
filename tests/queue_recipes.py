"""A recipe for the queue's tests: digits-mlp that raises at its first evaluation, i.e. at
step `eval_every` of a run (a queue job evaluates at each checkpoint), after its profile
(which times steps and never evaluates) has passed."""

from __future__ import annotations

from hetflow.training.recipes.digits import DigitsMLP


class FailsAtFirstEval(DigitsMLP):
    def evaluate(self, model, batches) -> dict[str, float]:
        raise RuntimeError("the test recipe fails at its first evaluation")
