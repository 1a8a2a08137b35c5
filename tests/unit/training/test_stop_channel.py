"""The stop request's channel (`training.loop.stop_channel`): what the queue writes is what rank
0 reads, whichever channel the run was given; cleared, it asks nothing; only rank 0 reads it,
and every rank stops at the checkpoint rank 0 agreed through the group's store."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch.distributed as dist

from hetflow.config import FaultPolicy, TrainConfig
from hetflow.training.loop.progress import STOP_FILE
from hetflow.training.loop.stop_channel import (
    FileStopChannel,
    RayStopChannel,
    StopChannel,
    channel_of,
    stop_channel,
)
from hetflow.training.loop.stop_request import StopRequest


class CountingChannel(StopChannel):
    """A channel in memory that counts its reads: a stand-in for any channel's contract."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.reads = 0

    def write(self, step: int) -> None:
        self.step = step

    def read(self) -> int | None:
        self.reads += 1
        return self.step

    def clear(self) -> None:
        self.step = None


def test_the_file_channel_reads_what_was_written_and_nothing_once_cleared(tmp_path):
    channel = stop_channel("local", tmp_path)
    assert isinstance(channel, FileStopChannel) and channel.read() is None
    channel.write(40)
    assert (tmp_path / STOP_FILE).read_text() == "40"  # the file the local queue always wrote
    assert stop_channel("local", tmp_path).read() == 40  # another process's channel sees it
    (tmp_path / STOP_FILE).write_text("half")  # a write caught half-way asks nothing yet
    assert channel.read() is None
    channel.clear()
    channel.clear()  # clearing a cleared channel is no error
    assert channel.read() is None and not (tmp_path / STOP_FILE).exists()


def test_rank_0_alone_reads_the_channel_and_every_rank_stops_at_its_agreed_step():
    """Only rank 0 asks the channel (once a step, until it has a request); both ranks stop at
    the first checkpoint the request allows, as rank 0 published it in the group's store."""
    store = dist.HashStore()
    channel, other = CountingChannel(), CountingChannel()
    rank0 = StopRequest(channel, 0, every=4, slack=1, store=store)
    rank1 = StopRequest(other, 1, every=4, slack=1, store=store)
    for boundary in range(1, 6):
        assert not rank0.asked(boundary) and not rank1.asked(boundary)
    channel.write(6)
    stops = [(b, rank0.asked(b), rank1.asked(b)) for b in range(6, 13)]
    assert [b for b, s0, s1 in stops if s0] == [b for b, s0, s1 in stops if s1] == [8]
    assert other.reads == 0
    assert channel.reads == 6  # boundaries 1-6; none once the step is agreed


@pytest.mark.parametrize(
    "launcher, on_loss, expected",
    [
        ("ray", "restart", RayStopChannel),
        ("local", "restart", FileStopChannel),
        ("ray", "continue", FileStopChannel),  # its own launcher runs the ranks here
    ],
)
def test_a_run_reads_the_channel_its_launcher_runs_it_through(
    tmp_path, launcher, on_loss, expected
):
    train = TrainConfig(faults=FaultPolicy(on_loss=on_loss))
    spec = SimpleNamespace(
        cluster=SimpleNamespace(launcher=launcher), train=train, run_dir=str(tmp_path / "q-low")
    )
    channel = channel_of(spec)
    assert type(channel) is expected
    if expected is RayStopChannel:
        assert channel.key == "q-low"  # the run's name, as the queue keys it


def test_the_file_channel_reads_the_progress_rank_0_writes_beside_it(tmp_path):
    from hetflow.training.loop.progress import ProgressFile
    from hetflow.training.loop.stop_channel import FileStopChannel

    channel = FileStopChannel(tmp_path)
    assert channel.progress() is None  # before rank 0's first write
    progress = ProgressFile(tmp_path / "progress.json", 3)
    assert channel.progress() == 3
    progress.write(11)
    channel.report(12)  # rank 0's report: the file is its record, nothing else is written
    assert channel.progress() == 11
