"""Whether a classifier's learning-rate rule holds: the same epochs at a larger global batch,
trained at the tuned lr as given, scaled, and scaled with the warm-up.

    hetflow bench lr_rule [--recipe digits-cnn] [--batches 128,512,1024] [--epochs 10]

One process on the digits (80/20 split, seed 0), each step on a global batch drawn from a
seeded shuffle, epoch by epoch: the gradient the loop all-reduces is the mean over the global
batch whatever its split (tests/integration/training/test_training.py), so one process stands for
any cluster.
Every batch runs the same number of epochs (fewer steps at a larger batch, as Goyal et al.
2017 compare), with the optimizer and scheduler a run builds (`training.loop.optim`) under
each rule: `none` (the recipe's lr as given), the recipe's rule (or `--rule`) without warm-up,
and with the warm-up of `--warmup` steps (default: the recipe's). Reports each variant's
steps, lr, final test accuracy and mean training loss over its last tenth of steps.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch

from hetflow.cli.args import Parser, add_recipe_arg
from hetflow.config import BUILTIN_RECIPES, LR_RULES, TrainConfig
from hetflow.infra.data.format import digits_source
from hetflow.training.loop.optim import (
    build_optimizer,
    build_scheduler,
    resolve_optimizer,
    step_scheduler,
)
from hetflow.training.recipes import (
    DataInfo,
    eval_batches,
    evaluate,
    get_recipe,
    seeded_model,
)


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="hetflow bench lr_rule", description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--batches", default="128,512,1024", help="global batches, comma-separated")
    p.add_argument("--epochs", type=float, default=10.0, help="epochs every variant trains")
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps (default: recipe's)")
    p.add_argument("--rule", choices=LR_RULES, help="the rule to compare (default: recipe's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the figures to this file")
    add_recipe_arg(p, "digits-cnn", BUILTIN_RECIPES)
    return p


def variants(recipe, warmup: int | None, rule: str | None = None) -> dict[str, dict]:
    """The TrainConfig fields of each variant: the lr as given, the rule (the recipe's unless
    `rule`), the rule warmed up."""
    rule = rule or recipe.lr_scaling
    steps = recipe.lr_warmup_steps if warmup is None else warmup
    return {
        "none": {"lr_scaling": "none"},
        f"{rule}, no warm-up": {"lr_scaling": rule, "lr_warmup_steps": 0},
        f"{rule}, warm-up {steps}": {"lr_scaling": rule, "lr_warmup_steps": steps},
    }


def train_one(recipe, data: dict, train: TrainConfig, epochs: float) -> dict:
    """`epochs` of `train`'s global batch on the digits' training split, one process, as a
    run's optimizer and scheduler step; its final figures."""
    x, y = data["train"]
    model = seeded_model(recipe, DataInfo(), train.seed)
    resolved = resolve_optimizer(train, recipe)
    opt = build_optimizer(model, resolved)
    scheduler = build_scheduler(opt, resolved)
    rng = np.random.default_rng(train.seed)
    order = np.concatenate([rng.permutation(len(x)) for _ in range(int(epochs) + 2)])
    steps = max(1, round(epochs * len(x) / train.global_batch))
    losses = []
    for step in range(steps):
        idx = order[step * train.global_batch : (step + 1) * train.global_batch]
        loss_sum, count = recipe.loss(model, recipe.batch(x[idx], y[idx]))
        (loss_sum / count).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step_scheduler(scheduler)
        losses.append(float(loss_sum.detach()) / count)
    figures = evaluate(recipe, model, eval_batches(recipe, *data["test"]))
    return {
        "steps": steps,
        "lr_scaled": resolved.scaled_lr(),
        "accuracy": figures["accuracy"],
        "final_loss": float(np.mean(losses[-max(1, steps // 10) :])),
    }


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    torch.set_num_threads(1)
    recipe = get_recipe(a.recipe)
    data = digits_source(0.2, 0)
    rows = []
    for batch in [int(b) for b in a.batches.split(",")]:
        for name, fields in variants(recipe, a.warmup, a.rule).items():
            train = TrainConfig(recipe=a.recipe, global_batch=batch, seed=a.seed, **fields)
            row = {"batch": batch, "variant": name, **train_one(recipe, data, train, a.epochs)}
            rows.append(row)
            print(
                f"batch {batch:5d}  {name:22s} steps {row['steps']:4d}  lr {row['lr_scaled']:.4f}"
                f"  accuracy {row['accuracy']:.4f}  final loss {row['final_loss']:.4f}",
                flush=True,
            )
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"recipe": a.recipe, "epochs": a.epochs, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
