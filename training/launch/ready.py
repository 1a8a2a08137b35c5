"""A run spec as the ranks take it: nothing left for a rank to resolve.

The flows resolve a job at their entry (`training.job`) and the train task derives a diloco
run's rounds from its plan; the run spec carries both. `launch_ready` is where a spec that
does not (a benchmark's, a test's, a profile's, a job file written by hand) gets them, once:
the launcher calls it before launch and the worker on the spec it reads, and on a carried
spec it changes nothing and calls no resolver.
"""

from __future__ import annotations

from hetflow.training.launch.spec import RunSpec
from hetflow.training.loop.optim import is_resolved, resolve_optimizer
from hetflow.training.plan.rounds import has_rounds, resolve_rounds
from hetflow.training.recipes import recipe_of


def launch_ready(spec: RunSpec) -> RunSpec:
    """`spec` with its train config as the ranks run it, neither of them resolving anything:
    the optimizer and its learning-rate rule concrete (`resolve_optimizer`) and, for a
    training run, its rounds derived for its plan (`rounds.resolve_rounds`). A flow's job is
    resolved at its entry (`training.job`) and its rounds by the train task, so this changes
    nothing there; a benchmark's or a test's raw config is resolved here, once per launch."""
    train = spec.train
    if not is_resolved(train):
        train = resolve_optimizer(train, recipe_of(train))
    if spec.plan is not None and not has_rounds(train, spec.plan):
        train = resolve_rounds(train, spec.plan)
    return spec if train is spec.train else spec.model_copy(update={"train": train})
