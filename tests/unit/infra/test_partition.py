"""The partitioner's invariants, stated once and checked by hypothesis (pure: no I/O)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetflow.infra.data.partition import (
    PartitionError,
    SampleIndex,
    ShardSchedule,
    Stream,
    check_plan,
    epoch_order,
    needed_shards,
    shard_schedule,
    upcoming_shards,
)

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def index_of(labels: np.ndarray, shard_sizes: list[int]) -> SampleIndex:
    """The index of samples with these labels in shards of these sizes (laid end to end): per
    shard, the count of each class present in the data."""
    classes = np.unique(labels)
    bounds = np.cumsum([0, *shard_sizes])
    return SampleIndex(
        [[int((labels[a:b] == c).sum()) for c in classes] for a, b in itertools.pairwise(bounds)]
    )


@st.composite
def datasets(draw, min_size=1, max_size=160):
    """An index (labels of possibly skewed classes, possibly sorted by label, in one shard or
    several) and a block size (None: one block of all shards)."""
    n = draw(st.integers(min_size, max_size))
    classes = draw(st.integers(1, 6))
    weights = draw(st.lists(st.integers(1, 8), min_size=classes, max_size=classes))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    labels = rng.choice(classes, size=n, p=np.array(weights) / sum(weights))
    if draw(st.booleans()):
        labels = np.sort(labels)  # the worst case for shard-local reading
    sizes = [n]
    if draw(st.booleans()):
        size = draw(st.integers(1, max(1, n // 2)))
        sizes = [min(size, n - s) for s in range(0, n, size)]
    return index_of(labels, sizes), draw(st.sampled_from([1, 2, 3, None]))


def _counts(order: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """cum[c, i] = number of class-c samples among the first i of `order`."""
    classes = np.unique(labels)
    onehot = labels[order][None, :] == classes[:, None]
    return np.concatenate([np.zeros((len(classes), 1), int), np.cumsum(onehot, axis=1)], axis=1)


@SETTINGS
@given(datasets(), st.integers(0, 1000), st.integers(0, 50))
def test_epoch_order_is_a_permutation_and_deterministic(data, seed, epoch):
    index, block = data
    order = epoch_order(index, seed, epoch, block)
    assert np.array_equal(np.sort(order), np.arange(index.n))
    assert np.array_equal(order, epoch_order(index, seed, epoch, block))


@SETTINGS
@given(datasets(min_size=30), st.integers(0, 1000), st.integers(0, 50))
def test_epochs_and_seeds_reshuffle(data, seed, epoch):
    index, block = data
    order = epoch_order(index, seed, epoch, block)
    assert not np.array_equal(order, epoch_order(index, seed, epoch + 1, block))
    assert not np.array_equal(order, epoch_order(index, seed + 1, epoch, block))


@SETTINGS
@given(datasets(), st.integers(0, 1000), st.integers(0, 20))
def test_every_window_has_the_class_mix_of_the_whole(data, seed, epoch):
    """For every window of the order and every class c with share p_c of C classes:
    |count_c - len(window) * p_c| < 1 + (C - 2) * p_c (< 2 for balanced classes).

    Each class's k-th sample sits at key (k + u_c) / n_c, so a key interval of length L holds
    L * n_c + d_c of them with d_c in (-1, 1]; eliminating L gives the bound. The shard-local
    order only changes which sample a class puts at its k-th key, so the bound is the same.
    """
    index, block = data
    labels = index.class_of(np.arange(index.n))
    order = epoch_order(index, seed, epoch, block)
    cum = _counts(order, labels)  # classes x (n + 1)
    n = len(labels)
    p = cum[:, -1] / n
    bound = 1 + max(len(p) - 2, 0) * p + 1e-9
    # All windows [i, j): counts = cum[:, j] - cum[:, i].
    i, j = np.triu_indices(n + 1, k=1)
    counts = cum[:, j] - cum[:, i]
    deviation = np.abs(counts - (j - i)[None, :] * p[:, None])
    assert (deviation < bound[:, None]).all(), deviation.max(axis=1)


@SETTINGS
@given(datasets())
def test_samples_are_numbered_shard_by_shard_class_by_class(data):
    index, _ = data
    shard = np.repeat(np.arange(index.shards), index.samples)
    label = np.concatenate([np.repeat(np.arange(index.classes), row) for row in index.counts])
    every = np.arange(index.n)
    assert np.array_equal(index.shard_of(every), shard)
    assert np.array_equal(index.class_of(every), label)


@SETTINGS
@given(datasets(), st.integers(0, 1000), st.integers(0, 5), st.data())
def test_any_window_computed_alone_is_that_slice_of_the_orders(data, seed, epoch, draw):
    """A fresh stream (a restarted rank: no state) gives any window of positions, also one
    across an epoch's end, as the slice of the epochs' whole orders; so does one that keeps
    only one within-block permutation."""
    index, block = data
    n = index.n
    orders = np.concatenate([epoch_order(index, seed, e, block) for e in (epoch, epoch + 1)])
    a = draw.draw(st.integers(0, 2 * n - 1))
    b = draw.draw(st.integers(a, 2 * n))
    for stream in (Stream(index, seed, block), Stream(index, seed, block, tables=1)):
        assert np.array_equal(stream.indices(epoch * n + a, epoch * n + b), orders[a:b])


@SETTINGS
@given(datasets(), st.integers(0, 1000), st.integers(0, 20))
def test_each_class_reads_its_shards_block_after_block(data, seed, epoch):
    """Shard-local: in the order, the samples of a class come block of shards by block of
    shards, in the epoch's shard order."""
    index, block = data
    stream = Stream(index, seed, block)
    order = stream.order(epoch)
    position = np.empty(index.shards, dtype=np.int64)
    position[stream.shard_order(epoch)] = np.arange(index.shards)
    blocks = position[index.shard_of(order)] // stream.block
    classes = index.class_of(order)
    for c in range(index.classes):
        assert (np.diff(blocks[classes == c]) >= 0).all()


@st.composite
def runs(draw):
    """A dataset, a global batch and a plan per step that changes mid-epoch (also the world)."""
    index, block = draw(datasets(min_size=2, max_size=120))
    n = index.n
    batch = draw(st.integers(1, n))
    steps = -(-2 * n // batch)  # two epochs' worth of positions
    plans = []
    for _ in range(steps):
        world = draw(st.integers(1, min(5, batch)))
        cuts = (
            sorted(
                draw(
                    st.lists(
                        st.integers(1, batch - 1),
                        min_size=world - 1,
                        max_size=world - 1,
                        unique=True,
                    )
                )
            )
            if world > 1
            else []
        )
        plans.append(list(np.diff([0, *cuts, batch])))
    return index, block, batch, plans


@SETTINGS
@given(runs(), st.integers(0, 1000))
def test_plan_changes_mid_epoch_lose_and_repeat_nothing(run, seed):
    index, block, batch, plans = run
    n = index.n
    stream = Stream(index, seed, block=block)
    positions, indices = [], []
    for step, plan in enumerate(plans):
        for rank, local in enumerate(plan):
            idx = stream.step_indices(step, plan, rank)
            a, b = stream.step_positions(step, plan, rank)
            assert len(idx) == local == b - a  # each rank's share is its local batch
            positions.extend(range(a, b))
            indices.extend(idx)
    order = np.argsort(positions)
    positions, indices = np.asarray(positions)[order], np.asarray(indices)[order]
    assert np.array_equal(positions, np.arange(len(plans) * batch))  # no gap, no overlap
    assert np.array_equal(np.sort(indices[:n]), np.arange(n))  # epoch 0: each sample once
    assert np.array_equal(np.sort(indices[n : 2 * n]), np.arange(n))  # epoch 1 as well
    assert np.array_equal(indices[:n], stream.order(0))


@SETTINGS
@given(runs(), st.integers(0, 100), st.integers(1, 6))
def test_shards_for_prefetch_are_the_shards_the_next_steps_read(run, seed, depth):
    index, block, _, plans = run
    stream = Stream(index, seed, block=block)
    shard_of = index.shard_of(np.arange(index.n))  # per sample, for the brute force
    plan, rank = plans[0], len(plans[0]) - 1
    schedule = ShardSchedule(stream, plan, rank, block=3)
    steps = min(len(plans), 12)
    rows = shard_schedule(stream, 0, 2 * steps + 2, plan, rank)
    for step in range(steps):
        idx = stream.step_indices(step, plan, rank)
        expected = list(dict.fromkeys(int(s) for s in shard_of[idx]))
        assert needed_shards(stream, step, plan, rank) == expected == schedule(step)
        assert rows[step] == expected
        ahead = upcoming_shards(stream, step, plan, rank, depth, horizon=steps)
        assert ahead == schedule.upcoming(step, depth, horizon=steps)
        # Brute force: the first `depth` shards of later steps that this step does not read.
        brute = []
        for t in range(step + 1, step + 1 + steps):
            later = dict.fromkeys(int(s) for s in shard_of[stream.step_indices(t, plan, rank)])
            brute += [s for s in later if s not in expected and s not in brute]
        assert ahead == brute[:depth]


def test_shard_local_order_reads_few_shards_per_step():
    """Why the shard-local order exists: a step needs a handful of shards, not all of them."""
    rng = np.random.default_rng(0)
    index = index_of(rng.integers(0, 10, size=6400), [200] * 32)
    plan = [32, 32, 64]
    local = Stream(index, 0)
    spread = Stream(index, 0, block=None)  # one block of all shards: the unlocal shuffle
    steps = 6400 // 128
    per_step_local = [len(needed_shards(local, t, plan, 0)) for t in range(steps)]
    per_step_global = [len(needed_shards(spread, t, plan, 0)) for t in range(steps)]
    assert np.mean(per_step_local) < 4
    assert np.mean(per_step_global) > 16
    assert np.array_equal(spread.order(3), epoch_order(index, 0, 3, block=None))


@pytest.mark.parametrize(
    "n, plan, message",
    [
        (4, [1, 1, 1, 1, 1], "5 ranks but only 4 samples"),
        (10, [8, 8], "global batch 16 is larger than its 10 samples"),
        (10, [], "no ranks"),
        (10, [0, 0], "sum to >= 1"),
        (10, [3, -1], "sum to >= 1"),
    ],
)
def test_plans_that_cannot_share_the_samples_are_refused(n, plan, message):
    with pytest.raises(PartitionError, match=message) as e:
        check_plan(n, plan, "s3://b/ds (train split)")
    assert str(e.value).startswith("s3://b/ds (train split): ")


def test_check_plan_accepts_a_plan_that_fits():
    check_plan(10, [2, 3, 5])
    check_plan(1, [1])
