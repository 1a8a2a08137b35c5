"""The memory one process holds training a gpt size: one window, fp32, AdamW, on this CPU.

    python -m benchmarks.gpt_memory medium 1024   # size, context

Peak resident memory after building the model, after one backward pass and after the
optimizer's step, beside 16 bytes per parameter (fp32 weights, gradients and AdamW's two
moments): what one DDP rank holds with gradients in DDP's buckets (`gradient_as_bucket_view`),
the figure `training/recipes/gpt.py` states per size. Peak RSS only rises, so each line is the
peak so far.
"""

from __future__ import annotations

import resource
import sys
import time

import torch

from hetflow.config import TrainConfig
from hetflow.training.loop.optim import build_optimizer, resolve_optimizer
from hetflow.training.recipes import DataInfo, get_recipe, parameter_count


def peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # Linux: kB


def main(size: str, context: int) -> None:
    torch.set_num_threads(2)
    recipe = get_recipe("gpt", size=size, context=context)
    model = recipe.build_model(DataInfo(kind="tokens", vocab=256))
    n = parameter_count(model)
    print(f"{size}, context {context}: {n / 1e6:.1f}M parameters")
    print(f"  built:          peak {peak_gb():.2f} GB (fp32 weights {4 * n / 1e9:.2f} GB)")
    train = resolve_optimizer(TrainConfig(recipe="gpt", global_batch=1), recipe)
    opt = build_optimizer(model, train)
    window = torch.randint(0, 256, (1, context + 1))
    t = time.monotonic()
    loss, count = recipe.loss(model, (window[:, :-1], window[:, 1:]))
    (loss / count).backward()
    print(f"  backward:       peak {peak_gb():.2f} GB ({time.monotonic() - t:.0f} s)")
    opt.step()
    print(f"  AdamW step:     peak {peak_gb():.2f} GB (16 B/parameter: {16 * n / 1e9:.2f} GB)")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
