"""Workers that join a running job in place under `faults.on_loss: continue`, on real
processes: a late worker is admitted at a step boundary, receives the weights, optimizer and
plan from the leader and takes a share from the step it joins at; no step is redone, the
replicas end equal; the bad cases of a join end in a run that goes on, never a hang."""

from __future__ import annotations

import pytest

from hetflow.config import ClusterSpec, ConfigError, TrainConfig
from hetflow.config.rules import check_on_loss


def test_join_at_is_checked_in_one_line_naming_the_field():
    cluster = ClusterSpec.from_speeds([1, 1])
    for join_at, word in [({0: 3}, "rank 0"), ({5: 3}, "rank 5"), ({1: 99}, "step 99")]:
        train = TrainConfig(
            recipe="digits-mlp", steps=30, faults={"on_loss": "continue", "join_at": join_at}
        )
        with pytest.raises(ConfigError, match=f"train.faults.join_at: .*{word}") as e:
            check_on_loss(cluster, train)
        assert "\n" not in str(e.value)
    for field, value in (("join_at", {1: 3}), ("replace", True)):
        train = TrainConfig(recipe="digits-mlp", faults={field: value})
        with pytest.raises(ConfigError, match=f"train.faults.{field}: .*'continue' only"):
            check_on_loss(cluster, train)


def test_the_queue_finds_a_worker_in_the_slot_it_holds_now_not_its_launch_slot():
    """`live.Handle.rank_of` over the launcher's `holders`: a worker added in place into
    another's slot is found there; the worker whose slot it took runs no rank; a late one not
    started yet still has its own."""
    import threading
    from types import SimpleNamespace

    from hetflow.training.launch.live import Handle

    cluster = ClusterSpec.from_speeds([1, 1, 2, 4])
    job = SimpleNamespace(
        spec=SimpleNamespace(cluster=cluster),
        lock=threading.Lock(),
        holders={0: "w0", 1: "spare", 2: "w2"},  # w1 left, spare joined in its slot; w3 late
    )
    handle = Handle(job)
    assert [handle.rank_of(w) for w in ("w0", "spare", "w1", "w3", "nope")] == [
        0,
        1,
        None,
        3,
        None,
    ]
