"""`hetflow bench host`, small: real gloo processes and real steps, JSON shape and what holds."""

from __future__ import annotations

import pytest

from hetflow.config import ConfigError

from benchmarks.host import main


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--worlds", "2,x"], "--worlds"),
        (["--batches", "0"], "--batches"),
        (["--batches", "32,32"], "--batches"),  # one batch has no line: refused before running
        (["--passes", "0"], "--passes"),
        (["--gloo-threads", "0"], "--gloo-threads"),
    ],
)
def test_bench_host_refuses_bad_numbers_naming_the_flag(argv, flag):
    with pytest.raises(ConfigError, match=flag):
        main(argv)
