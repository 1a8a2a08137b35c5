"""`hetflow bench data`, small, against the moto S3 over HTTP: JSON shape and what must hold."""

from __future__ import annotations

import pytest

from benchmarks.data import main, simulate_lru


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--plan", "8,x"], "--plan"),
        (["--rank", "2", "--plan", "8,8"], "--rank"),
        (["--variants", "cache,bogus"], "--variants"),
        (["--epochs", "0"], "--epochs"),
        (["--plan", "8,8", "--steps-per-epoch", "1", "--shard-samples", "0"], "--shard-samples"),
    ],
)
def test_bench_data_refuses_bad_arguments(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().out


def test_lru_model():
    sizes = [10, 10, 10, 10]
    # Budget of two shards: a cyclic scan hits nothing; a re-read of the most recent hits.
    assert simulate_lru([[0], [1], [2], [0], [1], [2]], sizes, 20) == [10] * 6
    assert simulate_lru([[0], [1], [1, 0], [2], [0]], sizes, 20) == [10, 10, 0, 10, 0]
    assert simulate_lru([[0, 1, 2, 3]], sizes, 0) == [40]  # only the one just read is kept


def test_train_mode_refuses_bad_flags_in_one_line(capsys):
    assert main(["--train", "--epochs", "1"]) == 2
    assert (
        capsys.readouterr().out.strip()
        == "hetflow bench data --train: error: --epochs: invalid value 1"
    )
