"""strategy 'diloco': inner step counts that follow each worker's speed (no worker waits
inside a round), the outer step on the sample-weighted change on real gloo ranks (fp32, bf16,
int8; staleness), the settings refused before launch, and a run through the worker."""

from __future__ import annotations

import pytest
import torch

from hetflow.config import ClusterSpec, ConfigError, TrainConfig, check_job
from hetflow.emulation.presets import PRESETS
from hetflow.perf.fitting import fit_affine
from hetflow.records import Plan
from hetflow.training.plan.prior import published_prior
from hetflow.training.plan.rounds import (
    inner_batch,
    inner_counts,
    loop_counts,
    resolve_rounds,
    round_plan,
    round_samples,
)

DILOCO = TrainConfig(strategy="diloco", global_batch=64, steps=64, recipe="digits-mlp")


def _step_s(preset: str, batch: int) -> float:
    """A preset's published step time at `batch` on its fitted line (what the prior plans on)."""
    table = PRESETS[preset].latency_ms
    a, c = fit_affine(list(table), [ms / 1e3 for ms in table.values()])
    return max(a, 0.0) + max(c, 1e-9) * batch


@pytest.mark.parametrize("rates", [[1.0, 1.0, 2.0, 4.0], [3.0, 7.0, 11.0], [0.3, 5.0]])
@pytest.mark.parametrize("total", [16, 64, 101])
def test_inner_counts_follow_speed_so_no_worker_waits_within_a_step(rates, total):
    counts = inner_counts(rates, total)
    assert sum(counts) == total
    step = [1.0 / r for r in rates]  # one inner step's time on each worker
    busy = [k * t for k, t in zip(counts, step, strict=True)]
    common = total / sum(rates)  # the round's length if steps could be split
    for b, t in zip(busy, step, strict=True):
        assert abs(b - common) < t  # within one of its own inner steps of every other's end


def test_a_round_plan_gives_whole_inner_steps_by_speed_at_the_inner_batch():
    cluster = ClusterSpec.from_speeds(["t4", "t4", "v100", "a100"])
    plan = round_plan(published_prior(cluster, DILOCO), cluster, DILOCO)
    b = inner_batch(DILOCO, 4)
    assert sum(plan.local_batches) == round_samples(DILOCO, 4) == 16 * 4 * b
    assert all(s % b == 0 and s >= b for s in plan.local_batches)
    busy = [s // b * _step_s(w.preset, b) for s, w in zip(plan.local_batches, cluster.workers)]
    assert max(busy) - min(busy) <= max(_step_s(w.preset, b) for w in cluster.workers)
    assert plan.local_batches[3] > plan.local_batches[2] > plan.local_batches[0]


def test_the_loop_counts_rounds_of_the_samples_asked():
    plan = Plan.equal([round_samples(DILOCO, 4) // 4] * 4)
    loop = loop_counts(resolve_rounds(DILOCO, plan))
    assert loop.steps * loop.global_batch >= DILOCO.steps * DILOCO.global_batch
    assert (loop.steps - 1) * loop.global_batch < DILOCO.steps * DILOCO.global_batch
    assert resolve_rounds(TrainConfig(), plan) == TrainConfig()
    t = TrainConfig()
    assert loop_counts(t) == (t.steps, t.global_batch, t.eval_every, t.checkpoint_every)


def test_rounds_are_fields_of_their_own_and_steps_keep_meaning_steps():
    """Derived once from the plan (`resolve_rounds`): the synchronous fields as the user gave
    them, the rounds beside them; the loop counts rounds only where it is asked to
    (`loop_counts`), and refuses a diloco config whose rounds were never derived."""
    train = DILOCO.model_copy(update={"eval_every": 32, "checkpoint_every": 64})
    plan = Plan.equal([256, 768])  # a round of 1024 samples: 16 steps' worth at 64
    resolved = resolve_rounds(train, plan)
    kept = ("steps", "global_batch", "eval_every", "checkpoint_every", "recipe", "seed")
    assert {k: getattr(resolved, k) for k in kept} == {k: getattr(train, k) for k in kept}
    d = resolved.diloco
    assert (d.rounds, d.round_samples, d.round_inner_batch) == (4, 1024, 32)
    assert (d.round_eval_every, d.round_checkpoint_every) == (2, 4)
    assert loop_counts(resolved) == (4, 1024, 2, 4)
    assert resolve_rounds(resolved, plan) == resolved  # derived from the user's fields alone
    with pytest.raises(ValueError, match="not derived"):
        loop_counts(train)


def test_an_existing_diloco_yaml_loads_and_derives_the_rounds_it_meant(tmp_path):
    """A config written before the round fields existed loads as it is (they are empty) and
    derives the rounds the loop used to count, with steps still meaning steps."""
    import yaml

    from hetflow.config import load_mapping

    path = tmp_path / "train.yaml"
    old = {"strategy": "diloco", "steps": 100, "global_batch": 128, "eval_every": 50}
    path.write_text(yaml.safe_dump({**old, "diloco": {"round_steps": 4, "outer_lr": 0.5}}))
    train = TrainConfig.model_validate(load_mapping(path))
    assert train.diloco.rounds is None and train.steps == 100
    resolved = resolve_rounds(train, Plan.equal([4 * 32] * 4))  # 4 steps' worth of 4 x 32
    d = resolved.diloco
    # ceil(100 x 128 / 512) rounds; evaluation every 50 x 128 // 512 of them
    assert (d.rounds, d.round_samples, d.round_eval_every, d.round_inner_batch) == (25, 512, 12, 32)
    assert (resolved.steps, resolved.global_batch, resolved.eval_every) == (100, 128, 50)


@pytest.mark.parametrize(
    ("knobs", "field"),
    [
        ({"compression": "powersgd:4"}, "train.compression"),
        ({"accumulate": "auto"}, "train.accumulate"),
        ({"nonfinite": "skip"}, "train.nonfinite"),
        ({"precision": "fp16"}, "train.precision"),
        ({"allow_local_sgd": True}, "train.allow_local_sgd"),
    ],
)
def test_settings_diloco_cannot_run_with_are_refused_in_one_line(knobs, field):
    with pytest.raises(ConfigError) as e:
        check_job(ClusterSpec.from_speeds([1, 2]), DILOCO.model_copy(update=knobs))
    assert str(e.value).startswith(field) and "\n" not in str(e.value)


def test_staleness_without_rounds_is_refused():
    with pytest.raises(ConfigError, match=r"^train\.diloco\.staleness"):
        check_job(ClusterSpec.from_speeds([1, 2]), TrainConfig(diloco={"staleness": 1}))


def test_a_diloco_comparison_validates_as_one_job():
    """The demo's and compare's variants under diloco: the synchronous run beside the rounds."""
    from hetflow.training.job import resolve_job

    configs = DILOCO.compared()
    assert {c.strategy for c in configs.values()} == {"ddp", "diloco"}
    job = resolve_job(ClusterSpec.from_speeds([1, 2]), list(configs.values()))
    assert job.given == tuple(configs.values())
    assert [c.strategy for c in job.configs] == [c.strategy for c in configs.values()]


def test_a_memory_cap_under_the_inner_batch_is_refused():
    cluster = ClusterSpec.from_speeds([1, 2])
    cluster.workers[0].memory_cap_batch = 8
    with pytest.raises(ConfigError, match=r"^cluster\.workers\[w0\]\.memory_cap_batch"):
        round_plan(published_prior(cluster, DILOCO) or _equal(cluster), cluster, DILOCO)


def _equal(cluster):
    from hetflow.training.plan.prior import equal_prior

    return equal_prior(cluster, DILOCO)


def test_a_link_preset_sets_what_the_worker_does_not():
    from hetflow.config import WorkerSpec
    from hetflow.emulation.links import LINKS

    far = WorkerSpec(name="a", link="cross-region")
    assert (far.link_gbps, far.link_latency_ms) == (LINKS["cross-region"].gbps, 79.0)
    slow = WorkerSpec(name="a", link="cross-region", link_gbps=0.1)
    assert (slow.link_gbps, slow.link_latency_ms) == (0.1, 79.0)
    with pytest.raises(ValueError, match="same-zone, cross-zone, cross-region"):
        WorkerSpec(name="a", link="moon")


def test_a_transient_straggler_is_counted_in_rounds_under_diloco():
    from benchmarks.diloco import parse_straggler, stragglers_of

    slow = parse_straggler("3:40:80:4")
    assert stragglers_of(slow, TrainConfig()) == [(3, 40, 4.0), (3, 80, 1.0)]
    rounds = TrainConfig(strategy="diloco", diloco={"round_steps": 16})
    assert stragglers_of(slow, rounds) == [(3, 2, 4.0), (3, 5, 1.0)]
    with pytest.raises(ConfigError, match=r"^--straggler"):
        parse_straggler("3:80:40:4")


def test_going_on_without_a_lost_worker_shares_a_round_among_the_rest():
    from hetflow.records import Plan
    from hetflow.training.plan.planner import replan_without

    cluster = ClusterSpec.from_speeds([1, 1, 2])
    train = TrainConfig(strategy="diloco", global_batch=24, diloco={"round_steps": 4})
    plan = replan_without(cluster, Plan.equal([24, 24, 48]), {"w1": "node lost"}, train)
    assert plan.local_batches == [32, 0, 64]  # the round of the 2 left: 4 steps x 2 x 12
    assert sum(plan.local_batches) == round_samples(train, 2)


def test_a_run_going_on_without_a_lost_worker_derives_its_rounds_anew(tmp_path):
    """The Ray launcher's relaunch without a lost node (`go_on_without`): the rounds the run
    spec carries are those of the workers left, derived from the user's fields as before."""
    from hetflow.config import DatasetSpec
    from hetflow.training.launch.ray_train import go_on_without
    from hetflow.training.launch.spec import RunSpec

    cluster = ClusterSpec.from_speeds([1, 1, 2])
    given = TrainConfig(strategy="diloco", global_batch=24, steps=48, diloco={"round_steps": 4})
    plan = Plan.equal([24, 24, 48])
    train = resolve_rounds(given, plan)
    spec = RunSpec(
        run_name="r",
        variant="diloco",
        cluster=cluster,
        dataset=DatasetSpec(),
        train=train,
        plan=plan,
        run_dir=str(tmp_path),
    )
    left = go_on_without(spec, {"w1": "node lost"})
    assert left.plan.local_batches == [32, 64] and left.train.steps == 48
    d = left.train.diloco
    assert (d.round_samples, d.round_inner_batch, d.rounds) == (96, 12, 12)  # 48 x 24 / 96
    assert left.train == resolve_rounds(given, left.plan)


def test_a_round_in_seconds_is_what_each_worker_computes_in_that_time():
    from tests.profiles import profile_of, rank_profile

    cluster = ClusterSpec.from_speeds([1, 3])
    train = TrainConfig(strategy="diloco", global_batch=16, steps=100, diloco={"round_s": 2.0})
    profile = profile_of([rank_profile(0, 100.0), rank_profile(1, 300.0)])  # samples/s
    plan = round_plan(profile, cluster, train)
    assert plan.local_batches == [200, 600]  # 2 s x each one's samples/s, in steps of 8
    d = resolve_rounds(train, plan).diloco
    assert (d.round_samples, d.rounds, d.round_inner_batch) == (800, 2, 8)


class _Outer:
    """An `OuterStep` stand-in that records the weights of the rounds it is asked to end."""

    def __init__(self) -> None:
        self.ended: list[float] = []

    def end_round(self, weight: float) -> None:
        self.ended.append(weight)


def test_the_outer_step_hooks_the_inner_optimizer_after_the_rounds_last_step():
    """As torchft's DiLoCo: the outer step is a step post-hook on the inner optimizer, after
    the round's last inner step, with the rank's weight; a rank with no samples takes it at
    once (it joins every round's collective); a round begun before the last ended is refused."""
    from hetflow.training.loop.diloco import RoundOptimizer

    param = torch.nn.Parameter(torch.zeros(2))
    outer = _Outer()
    opt = RoundOptimizer(torch.optim.SGD([param], lr=0.1), outer)
    param.grad = torch.ones(2)
    opt.begin_round(3, 0.25)
    ended = []
    for _ in range(3):
        opt.step()
        ended.append(list(outer.ended))
    assert ended == [[], [], [0.25]]
    opt.begin_round(0, 0.0)
    assert outer.ended == [0.25, 0.0]
    opt.begin_round(2, 0.5)
    opt.step()
    with pytest.raises(RuntimeError, match="1 inner steps of the last to go"):
        opt.begin_round(1, 0.5)
