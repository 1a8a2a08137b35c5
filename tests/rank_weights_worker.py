"""torchrun entry for tests: hetflow's worker, with every rank (not only rank 0) also saving
its final weights as rank{R}.pt in the run directory, so a test can compare the ranks."""

from __future__ import annotations

from pathlib import Path

import torch

from hetflow.training import worker
from hetflow.training.loop import training_loop as loop

_weights = loop.TrainingLoop.weights


def _every_rank_saves(self: loop.TrainingLoop):
    state = {k: v.detach().to("cpu", copy=True) for k, v in self.net.model.state_dict().items()}
    torch.save(state, Path(self.spec.run_dir) / f"rank{self.rank}.pt")
    return _weights(self)


loop.TrainingLoop.weights = _every_rank_saves

if __name__ == "__main__":
    worker.main()
