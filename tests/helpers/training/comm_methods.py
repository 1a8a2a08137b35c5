"""Helpers both halves of test_comm_methods.py use: tests/unit/training/test_comm_methods.py and
tests/integration/training/test_comm_methods.py (and any other test module that imports them)."""

from __future__ import annotations

import torch


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
