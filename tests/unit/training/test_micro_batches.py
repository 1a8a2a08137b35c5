"""Micro-batches per worker (`train.accumulate: auto`): the plan's sizes and counts under the
memory caps, the bad input refused, and on real gloo ranks the accumulated gradient equal to
one process's on the global batch whatever each rank's count."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hetflow.cli import main
from hetflow.config import ClusterSpec, ConfigError, TrainConfig, check_job, validated
from hetflow.records import Plan
from hetflow.training.plan.balance import balance_batches, micro_cost, micro_split
from hetflow.training.plan.planner import make_plan, with_micro

from tests.helpers.training.micro_batches import AUTO_KW, _NoAmp
from tests.profiles import profile_of, rank_profile

AUTO = TrainConfig(**AUTO_KW)


@given(st.integers(0, 600), st.one_of(st.none(), st.integers(1, 64)))
@settings(max_examples=300, deadline=None)
def test_micro_batches_are_at_most_the_cap_and_ceil_share_over_cap_of_them(share, cap):
    parts = micro_split(share, cap)
    assert sum(parts) == share and all(p >= 1 for p in parts)
    if cap is not None:
        assert max(parts, default=0) <= cap
        assert len(parts) == math.ceil(share / cap)
    assert max(parts, default=0) - min(parts, default=0) <= 1  # as equal as integers allow


@st.composite
def micro_inputs(draw):
    n = draw(st.integers(1, 6))
    per_sample = draw(st.lists(st.floats(1e-5, 1e-2), min_size=n, max_size=n))
    latency = draw(st.lists(st.floats(0.0, 0.05), min_size=n, max_size=n))
    caps = draw(st.lists(st.one_of(st.none(), st.integers(1, 64)), min_size=n, max_size=n))
    return per_sample, latency, draw(st.integers(n, 1024)), caps


@given(micro_inputs())
@settings(max_examples=200, deadline=None)
def test_a_micro_batched_plan_sums_to_the_batch_and_records_its_micro_batches(inp):
    per_sample, latency, global_batch, caps = inp
    batches = balance_batches(per_sample, latency, global_batch, caps, micro=True)
    assert sum(batches) == global_batch and min(batches) >= 1
    plan = with_micro(Plan(local_batches=batches, caps=caps), AUTO)
    for b, cap, size, count in zip(batches, caps, plan.micro_batch, plan.micro_count, strict=True):
        assert count == (math.ceil(b / cap) if cap is not None else 1)
        assert cap is None or size <= cap
        assert size * count >= b > (size - 1) * count  # sizes as equal as integers allow


def test_a_fast_worker_short_of_memory_gets_past_its_cap_only_where_that_pays():
    # w3 is 4x the others' speed but holds 16 samples at once; passing its cap costs it one
    # more fixed cost per micro-batch
    per_sample, caps = [4e-4, 4e-4, 2e-4, 1e-4], [None, None, None, 16]
    cheap, dear = [2e-3] * 4, [2e-3, 2e-3, 2e-3, 0.03]
    capped = balance_batches(per_sample, cheap, 128, caps)
    assert capped[3] == 16
    micro = balance_batches(per_sample, cheap, 128, caps, micro=True)
    assert micro[3] > 32  # three or more micro-batches: the step is shorter for it

    def step(batches, lat):
        return max(
            micro_cost(a, c, b, k, True) for a, c, b, k in zip(lat, per_sample, batches, caps)
        )

    assert step(micro, cheap) < step(capped, cheap)
    # a micro-batch's fixed cost (30 ms) far above the others' whole step: it stays at its cap
    assert balance_batches(per_sample, dear, 128, caps, micro=True)[3] <= 16


def test_make_plan_records_micro_batches_and_leaves_the_capped_plan_as_it_was_when_off():
    profile = profile_of(
        [rank_profile(r, s, fit_latency_s=1e-3) for r, s in enumerate([250.0, 250.0, 500.0, 1e3])]
    )
    cluster = ClusterSpec.from_speeds([1, 1, 2, 4])
    cluster.workers[3].memory_cap_batch = 16
    off = make_plan(profile, cluster, TrainConfig(global_batch=128, schedule="proportional"))
    assert off.local_batches[3] == 16 and off.micro_batch == [] and off.micro_count == []
    auto = make_plan(
        profile, cluster, TrainConfig(global_batch=128, schedule="proportional", **AUTO_KW)
    )
    assert sum(auto.local_batches) == 128 and auto.local_batches[3] > 16
    assert auto.micro_count[3] == math.ceil(auto.local_batches[3] / 16) > 1
    assert auto.micro_count[:3] == [1, 1, 1] and auto.micro_batch[3] <= 16


def test_bad_accumulate_values_and_caps_under_one_sample_are_one_line_naming_the_field():
    with pytest.raises(ConfigError) as e:
        validated(TrainConfig, {"accumulate": "sometimes"}, "train")
    assert "train.accumulate" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError) as e:
        validated(ClusterSpec, {"workers": [{"name": "a", "memory_cap_batch": 0}]}, "cluster")
    assert "memory_cap_batch" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"^train\.accumulate: .*localsgd") as e:
        check_job(ClusterSpec.from_speeds([1, 1]), TrainConfig(compression="localsgd:4", **AUTO_KW))
    assert "\n" not in str(e.value)
    # caps that sum below the global batch are fine where the rest runs as micro-batches
    small = ClusterSpec.from_speeds([1, 1])
    for w in small.workers:
        w.memory_cap_batch = 8
    check_job(small, TrainConfig(global_batch=64, **AUTO_KW))
    with pytest.raises(ConfigError, match="memory_cap_batch"):
        check_job(small, TrainConfig(global_batch=64))


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--accumulate", "sometimes"], "--accumulate"),
        (["--accumulate", "auto", "--allow-local-sgd"], "train.accumulate"),
    ],
    ids=["bad-value", "with-local-sgd"],
)
def test_the_demo_refuses_bad_accumulate_flags_in_one_line(argv, expected, capsys, hetflow_home):
    assert main(["demo", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and len(err.splitlines()) == 1
    assert not (hetflow_home / "runs").exists()


def test_the_rebalancer_moves_a_capped_share_past_the_cap_and_back_when_it_slows():
    """Simulated ranks whose step is a + c x b per micro-batch of at most their cap: from the
    capped plan the re-balancer (micro) gives the fast rank more than its cap, then settles; a
    4x slow-down of that rank moves work off it again."""
    from hetflow.training.plan.rebalancer import Rebalancer

    latency, per_sample, caps = [2e-3] * 4, [4e-4, 4e-4, 2e-4, 1e-4], [None, None, None, 16]

    def times(plan, slow=1.0):
        return [
            micro_cost(a, c, b, k, True) * (slow if i == 3 else 1.0)
            for i, (a, c, b, k) in enumerate(zip(latency, per_sample, plan, caps, strict=True))
        ]

    plan = balance_batches(per_sample, latency, 128, caps)
    reb = Rebalancer(128, caps, latency, per_sample, micro=True)
    reb.observe(plan, times(plan))
    new = reb.propose(plan, 10)
    assert new is not None and new[3] > 16 and sum(new) == 128
    assert max(times(new)) < max(times(plan))
    reb.observe(new, times(new))
    assert reb.propose(new, 20) is None  # balanced: it stays
    reb.observe(new, times(new, slow=4.0))
    slowed = reb.propose(new, 30)
    assert slowed is not None and slowed[3] < new[3]


def test_bench_hetero_takes_memory_caps_and_micro_variants_and_refuses_bad_caps():
    from benchmarks.hetero import parse_args
    from benchmarks.hetero.aggregate import baseline_of

    _, bench = parse_args(["--memory-caps", ",,,16", "--variants", "baseline@micro,static@micro"])
    assert [w.memory_cap_batch for w in bench.cluster.workers] == [None, None, None, 16]
    assert bench.variants == ["baseline@micro", "static@micro"]
    assert baseline_of({"baseline@micro": {"x": 1}, "static": {}}) == {"x": 1}
    for bad in (",,,0", "1,2", "a,,,"):
        with pytest.raises(ConfigError, match="^--memory-caps: "):
            parse_args(["--memory-caps", bad])
    with pytest.raises(ConfigError, match="--variants"):
        parse_args(["--variants", "static@nano"])


class _Live:
    """The bytes of the tensors autograd holds for backward, and their peak: each saved tensor
    is held by a `_Held` that counts itself out when the graph that saved it is freed."""

    def __init__(self) -> None:
        self.now = self.peak = 0

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda held: held.tensor)

    def pack(self, t: torch.Tensor):
        return _Held(t, self)


class _Held:
    def __init__(self, t: torch.Tensor, live: _Live) -> None:
        self.tensor, self.live, self.nbytes = t, live, t.numel() * t.element_size()
        live.now += self.nbytes
        live.peak = max(live.peak, live.now)

    def __del__(self) -> None:
        self.live.now -= self.nbytes


class _LocalDDP(torch.nn.Module):
    """One process: the model as DDP's place holder, `no_sync` a no-op."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.module = model

    def forward(self, *args):
        return self.module(*args)

    def no_sync(self):
        from contextlib import nullcontext

        return nullcontext()


def _peak_saved_bytes(n: int, cap: int | None) -> int:
    from hetflow.training.loop.micro import split_batch
    from hetflow.training.loop.rank_step import Stepper
    from hetflow.training.loop.weighting import MeanOverCounts
    from hetflow.training.recipes import DataInfo, get_recipe, seeded_model

    recipe = get_recipe("digits-cnn")
    model = seeded_model(recipe, DataInfo(), 0)
    emu = SimpleNamespace(start=lambda key=None: None, finish=lambda: 0.0)
    local = _LocalDDP(model)
    net = SimpleNamespace(ddp=local, model=model, no_sync=local.no_sync)
    stepper = Stepper(net, emu, MeanOverCounts(1, 1), _NoAmp(), None, recipe, cap)
    rng = np.random.default_rng(0)
    batch = recipe.batch(rng.random((n, 64), dtype=np.float32), rng.integers(0, 10, n))
    live = _Live()
    with live.hooks():
        stepper.accumulate(split_batch(batch, n, cap), [n])
    assert live.now == 0  # every graph was freed after its backward
    return live.peak


def test_a_share_run_as_micro_batches_holds_no_more_for_backward_than_one_at_the_cap():
    """The peak of what autograd holds for backward (activations, counted exactly as the
    graph saves and frees them; allocator and host noise play no part) while 60 samples run
    under a cap of 16 is that of 16 samples in one pass, and well below 60's in one pass:
    each micro-batch's graph is freed by its backward before the next forward."""
    micro = _peak_saved_bytes(60, 16)  # 4 micro-batches of 15
    assert micro <= _peak_saved_bytes(16, None)
    assert micro < 0.5 * _peak_saved_bytes(60, None)
