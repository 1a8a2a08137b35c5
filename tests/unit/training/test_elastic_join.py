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


def test_spare_workers_are_checked_in_one_line_naming_the_field():
    cluster = ClusterSpec.from_speeds([1, 1])
    for spare, word in [(["w9"], "'w9' is not a worker"), (["w0", "w1"], "every worker")]:
        train = TrainConfig(recipe="digits-mlp", faults={"on_loss": "continue", "spare": spare})
        with pytest.raises(ConfigError, match=f"train.faults.spare: {word}") as e:
            check_on_loss(cluster, train)
        assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="train.faults.spare: .*'continue' only"):
        check_on_loss(cluster, TrainConfig(recipe="digits-mlp", faults={"spare": ["w1"]}))


def test_spare_and_late_slots_do_not_start_the_job():
    """`first_ranks`: the launcher starts every slot but the late ones and the spare ones;
    the spare ones stay free slots for `add_worker`."""
    from hetflow.records import Plan
    from hetflow.training.elastic.launch import first_ranks
    from hetflow.training.launch.spec import RunSpec

    faults = {"on_loss": "continue", "spare": ["w1", "w3"], "join_at": {2: 5}}
    spec = RunSpec(
        run_name="r",
        variant="v",
        cluster=ClusterSpec.from_speeds([1, 1, 1, 1, 1]),
        dataset={"url": "s3://b/d"},
        train=TrainConfig(recipe="digits-mlp", steps=30, faults=faults),
        plan=Plan.equal([8] * 5),
        run_dir="/tmp/r",
    )
    assert first_ranks(spec) == [0, 4]
