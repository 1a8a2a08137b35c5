"""Wire-byte accounting and the emulated link (pure)."""

from __future__ import annotations

import pytest

from hetflow.emulation.link import Link
from hetflow.training.comm import allgather_bytes, ring_allreduce_bytes


def test_wire_formulas():
    assert ring_allreduce_bytes(1000, 4) == 1500
    assert ring_allreduce_bytes(1000, 1) == 0
    assert allgather_bytes(1000, 4) == 3000


def test_link_costs_bytes_over_bandwidth_plus_latency():
    assert Link(None, 0.0).delay(1e9, 3) == 0.0
    assert Link(100.0, 0.001).delay(1_000_000, 2) == pytest.approx(0.002 + 8e6 / 100e9)
