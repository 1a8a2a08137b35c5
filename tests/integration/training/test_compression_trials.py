"""'auto' chooses its compression by measurement: the candidates it tries, the choice from a
table of measured steps (pure), and trials on real gloo ranks that leave the run as it would
have been with the chosen method set from the start."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hetflow.config import (
    ClusterSpec,
    DatasetSpec,
    TrainConfig,
    WorkerSpec,
)
from hetflow.records import Plan, RunResult
from hetflow.training.comm import DENSE_WARMUP_STEPS
from hetflow.training.plan.compression import choose_from_trials

from tests.dist import run_ranks
from tests.helpers.training.compression_trials import M

# -- trials on real ranks ---------------------------------------------------------------------

WORLD = 2


# the run's PowerSGD compresses after DENSE_WARMUP_STEPS; enough steps that the communication
# 'none' measures could pay for trying the others (`Trials.not_worth_trying`)
STEPS = DENSE_WARMUP_STEPS + 100


LINK_GBPS = 0.05  # slow enough that plain all-reduce is the slowest candidate by far


def train_rank(rank: int, world: int, arg: dict) -> dict:
    """One rank of hetflow's worker on the job `arg` (a RunSpec's JSON); rank 0 writes
    result.json and model.pt."""
    from hetflow.training import worker
    from hetflow.training.launch.spec import RunSpec

    worker.run(RunSpec.model_validate(arg), rank)
    return {}


def _spec(dataset: DatasetSpec, run_dir: Path, compression: str, plan: Plan, **knobs):
    from hetflow.training.launch.spec import RunSpec

    workers = [WorkerSpec(name=f"w{i}", speed=1.0, link_gbps=LINK_GBPS) for i in range(WORLD)]
    train = TrainConfig(
        **{
            "recipe": "digits-mlp",
            "global_batch": 32,
            "steps": STEPS,
            "schedule": "equal",
            "compression": compression,
            "eval_every": 100,
            "checkpoint_every": 100,
            "target_accuracy": None,
            **knobs,
        }
    )
    run_dir.mkdir(parents=True)
    return RunSpec(
        run_name=run_dir.name,
        variant=compression,
        cluster=ClusterSpec(workers=workers, time_scale=2.0),
        dataset=dataset,
        train=train,
        plan=plan,
        run_dir=str(run_dir),
    )


@pytest.fixture
def local_digits(tmp_path) -> DatasetSpec:
    """Digits as shards in a folder (the ranks, forked from the test's fork server, need no
    S3 endpoint)."""
    from hetflow.infra.data.format import digits_source, write_dataset

    (tmp_path / "digits" / "train").mkdir(parents=True)
    (tmp_path / "digits" / "test").mkdir()
    spec = DatasetSpec(url=(tmp_path / "digits").as_uri(), cache_dir=str(tmp_path / "cache"))
    write_dataset(spec.url, digits_source(spec.test_fraction, spec.seed), spec.shard_samples)
    return spec


def _run(spec) -> tuple[RunResult, dict[str, torch.Tensor]]:
    run_ranks(train_rank, WORLD, spec.model_dump(mode="json"), Path(spec.run_dir) / "ranks")
    result = RunResult.model_validate_json((Path(spec.run_dir) / "result.json").read_text())
    return result, torch.load(Path(spec.run_dir) / "model.pt")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_auto_tries_every_candidate_keeps_the_fastest_and_trains_as_if_set_from_the_start(
    local_digits, tmp_path
):
    candidates = [M(m) for m in ("none", "fp16", "bf16", "powersgd:4")]
    plan = Plan(local_batches=[16, 16], compression_candidates=candidates)
    auto, auto_weights = _run(_spec(local_digits, tmp_path / "auto", "auto", plan))

    tables = [r.trials for r in auto.ranks]
    assert all(t is not None for t in tables)
    assert len({t.chosen for t in tables}) == 1  # every rank trains the same method
    assert [[x.step_s for x in t.trials] for t in tables] == [
        [x.step_s for x in tables[0].trials]
    ] * WORLD  # from the same figures
    lead = tables[0]
    assert [x.method for x in lead.trials] == candidates and lead.steps > 0
    assert all(x.step_s is not None and x.step_s > 0 and not x.error for x in lead.trials)
    assert lead.chosen == choose_from_trials(lead.trials)[0]  # the rule, on the agreed table
    assert lead.chosen != M("none")  # the link makes every compressing method faster
    none, fp16 = lead.trials[0], lead.trials[1]
    assert fp16.bytes_per_step == none.bytes_per_step / 2 > 0  # the trials went over the wire

    # the trials left no trace in the run: its steps from 0, its bytes its own
    for r in auto.ranks:
        assert [rec.step for rec in r.records] == list(range(STEPS))
        assert r.bytes_total == pytest.approx(sum(rec.bytes_sent for rec in r.records))

    # and it trained exactly as the chosen method set from the start does
    fixed_plan = Plan(local_batches=[16, 16], compression=lead.chosen)
    fixed, fixed_weights = _run(
        _spec(local_digits, tmp_path / "fixed", str(lead.chosen), fixed_plan)
    )
    assert fixed.lead.trials is None
    assert fixed_weights.keys() == auto_weights.keys()
    for k in fixed_weights:
        assert torch.equal(fixed_weights[k], auto_weights[k]), k
    assert [rec.loss_sum for rec in fixed.lead.records] == [
        rec.loss_sum for rec in auto.lead.records
    ]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_local_sgd_trial_times_its_averaging_step_at_the_rate_it_runs(local_digits, tmp_path):
    candidates = [M("none"), M("localsgd:4")]
    plan = Plan(local_batches=[16, 16], compression_candidates=candidates)
    spec = _spec(local_digits, tmp_path / "local", "auto", plan, steps=100, allow_local_sgd=True)
    result, _ = _run(spec)
    none, local = result.lead.trials.trials
    assert none.step_s and local.step_s and not local.error
    # one model average (an all-reduce of the parameters) in the 4 timed steps
    assert local.bytes_per_step == pytest.approx(none.bytes_per_step / 4)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_auto_keeps_none_untried_where_the_others_cannot_pay_for_their_trials(
    local_digits, tmp_path
):
    # 2 steps: whatever another method saves of 'none''s communication, it cannot save the
    # trial steps it would cost; 'none' is kept after its own trial, and the reason says so
    candidates = [M(m) for m in ("none", "fp16", "powersgd:4")]
    plan = Plan(local_batches=[16, 16], compression_candidates=candidates)
    spec = _spec(local_digits, tmp_path / "short", "auto", plan, steps=2)
    result, _ = _run(spec)
    trials = [r.trials for r in result.ranks]
    assert all(t.chosen == M("none") and len(t.trials) == 1 for t in trials)
    assert "kept without trials of the 2 others" in trials[0].reason
    assert [rec.step for rec in result.lead.records] == [0, 1]
