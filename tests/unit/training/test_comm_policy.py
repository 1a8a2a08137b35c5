"""The profile's rule for 'auto' where no method can be tried (one worker): the compression
method a profiled communication share calls for. Where methods can be tried, the choice is
measured: tests/{unit,integration}/training/test_compression_trials.py."""

from __future__ import annotations

import pytest

from hetflow.records import CompressionMethod
from hetflow.training.plan.compression import choose_compression


def test_auto_keeps_none_when_communication_is_cheap(caplog):
    caplog.set_level("INFO", logger="hetflow.training.plan")
    method, reason = choose_compression(0.05)
    assert method == CompressionMethod(name="none") and "5%" in reason
    assert "none" in caplog.text and "5%" in caplog.text  # the reason is logged


def test_auto_compresses_when_communication_dominates():
    method, reason = choose_compression(0.7)
    assert method.name == "powersgd" and "70%" in reason
    # from the threshold on
    assert method == CompressionMethod.parse("powersgd:4") and choose_compression(0.4)[0] == method


@pytest.mark.parametrize("share", [0.0, 0.2, 0.39, 0.41, 0.6, 0.99, 1.0])
def test_auto_is_monotone_in_the_share(share):
    order = ["none", "powersgd:4"]
    lower = str(choose_compression(max(0.0, share - 0.05))[0])
    assert order.index(lower) <= order.index(str(choose_compression(share)[0]))
