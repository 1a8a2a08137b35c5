"""Helpers both halves of test_fault_policy.py use: tests/unit/training/test_fault_policy.py and
tests/integration/training/test_fault_policy.py (and any other test module that imports them)."""

from __future__ import annotations

from hetflow.config import FaultPolicy

POLICY = FaultPolicy(group_restarts=5, placement_tries=2, task_retries=2, task_retry_delay_s=0)
