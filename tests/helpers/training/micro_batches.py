"""Helpers both halves of test_micro_batches.py use: tests/unit/training/test_micro_batches.py and
tests/integration/training/test_micro_batches.py (and any other test module that imports them)."""

from __future__ import annotations

import torch

AUTO_KW = {"accumulate": "auto"}


class _NoAmp:
    """fp32: no autocast, no loss scale."""

    def autocast(self):
        return torch.autocast("cpu", enabled=False)

    def scale(self, t):
        return t
