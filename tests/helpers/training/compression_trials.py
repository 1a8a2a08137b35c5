"""Helpers both halves of test_compression_trials.py use:
tests/unit/training/test_compression_trials.py and
tests/integration/training/test_compression_trials.py (and any other test module that imports
them)."""

from __future__ import annotations

from hetflow.records import CompressionMethod

M = CompressionMethod.parse
