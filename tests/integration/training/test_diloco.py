"""strategy 'diloco': inner step counts that follow each worker's speed (no worker waits
inside a round), the outer step on the sample-weighted change on real gloo ranks (fp32, bf16,
int8; staleness), the settings refused before launch, and a run through the worker."""

from __future__ import annotations

import pytest
import torch

from hetflow.config import ClusterSpec, TrainConfig

from tests.dist import run_ranks

# -- the outer step on real gloo ranks ---------------------------------------------------------

WEIGHTS = [0.25, 0.75]  # rank r's share of the round's samples


CHANGE = [[1.0, -2.0, 0.5], [-3.0, 4.0, 1.0]]  # each rank's parameter change over a round


SCENARIOS = {
    "plain": ({"outer_lr": 1.0, "outer_momentum": 0.0}, 1),
    "int8": ({"outer_lr": 0.5, "outer_momentum": 0.9, "send": "int8"}, 2),
    "stale": ({"outer_lr": 1.0, "outer_momentum": 0.0, "staleness": 1}, 2),
}


def outer_rank(rank: int, world: int, arg: dict) -> dict:
    """One rank, every scenario in turn (one launch): a 3-parameter model moved by
    CHANGE[rank] each round for the scenario's rounds of the outer step with its options; the
    anchor and the model after each round, the bytes sent; then `resumed` (`_resumed`)."""
    from hetflow.training.comm import WireCounter

    counter = WireCounter(world)
    counter.install()
    out = {}
    for name, (cfg, rounds) in SCENARIOS.items():
        out[name] = _rounds(rank, cfg, rounds, counter)
    out["resumed"] = _resumed(rank)
    counter.uninstall()
    return out


def _one_round(rank: int, param, outer) -> None:
    with torch.no_grad():
        param += torch.tensor(CHANGE[rank])
    outer.end_round(WEIGHTS[rank])


def _rounds(rank: int, cfg: dict, rounds: int, counter) -> dict:
    from hetflow.config import DiLoCoConfig
    from hetflow.training.comm.outer import OuterStep

    before = counter.total_bytes
    param = torch.nn.Parameter(torch.zeros(3))
    outer = OuterStep([param], DiLoCoConfig(**cfg))
    seen = []
    for _ in range(rounds):
        _one_round(rank, param, outer)
        seen.append({"anchor": outer.anchor.tolist(), "model": param.tolist()})
    outer.drain()
    return {"seen": seen, "anchor": outer.anchor.tolist(), "bytes": counter.total_bytes - before}


def _resumed(rank: int) -> dict:
    """Two rounds with Nesterov momentum, a checkpoint of the outer step, a third round; then
    a fresh model and outer step loaded from the checkpoint and the same third round."""
    from hetflow.config import DiLoCoConfig
    from hetflow.training.comm.outer import OuterStep

    cfg = DiLoCoConfig(outer_lr=0.5, outer_momentum=0.9)
    param = torch.nn.Parameter(torch.zeros(3))
    outer = OuterStep([param], cfg)
    for _ in range(2):
        _one_round(rank, param, outer)
    saved = outer.state_dict()
    _one_round(rank, param, outer)
    fresh = torch.nn.Parameter(torch.full((3,), 7.0))
    again = OuterStep([fresh], cfg)
    again.load_state_dict(saved)
    resumed_at = fresh.tolist()
    _one_round(rank, fresh, again)
    return {"went_on": param.tolist(), "resumed": fresh.tolist(), "at": resumed_at}


@pytest.fixture(scope="module")
def outer_ranks(tmp_path_factory) -> list[dict]:
    return run_ranks(outer_rank, 2, {}, tmp_path_factory.mktemp("outer"))


def _weighted() -> torch.Tensor:
    return sum(w * torch.tensor(c) for w, c in zip(WEIGHTS, CHANGE, strict=True))


def test_the_averaged_change_is_weighted_by_samples(outer_ranks):
    # outer lr 1, no momentum: the sample-weighted average of the two models
    for r in (rank["plain"] for rank in outer_ranks):
        torch.testing.assert_close(torch.tensor(r["anchor"]), _weighted())
        torch.testing.assert_close(torch.tensor(r["seen"][0]["model"]), _weighted())
        assert r["bytes"] == 3 * 4  # a ring all-reduce of 3 fp32 over 2 ranks: 2(n-1)/n x B


def test_nesterov_outer_momentum_and_int8_sends(outer_ranks):
    ref = torch.nn.Parameter(torch.zeros(3))  # torch's SGD on the exact weighted change
    opt = torch.optim.SGD([ref], lr=0.5, momentum=0.9, nesterov=True)
    for _ in range(2):
        ref.grad = -_weighted()
        opt.step()
    for r in (rank["int8"] for rank in outer_ranks):
        torch.testing.assert_close(torch.tensor(r["anchor"]), ref.detach(), atol=0.05, rtol=0)
        assert r["bytes"] == 2 * (3 + 4)  # per round, an all-gather of 3 int8 and a scale


def test_a_stale_round_is_applied_a_round_later_keeping_local_progress(outer_ranks):
    for rank, r in enumerate(x["stale"] for x in outer_ranks):
        first, second = r["seen"]
        assert first["anchor"] == [0.0, 0.0, 0.0]  # round 0 still in flight
        # round 0's average landed after round 1: the anchor plus this rank's round 1
        torch.testing.assert_close(torch.tensor(second["anchor"]), _weighted())
        mine = _weighted() + torch.tensor(CHANGE[rank])
        torch.testing.assert_close(torch.tensor(second["model"]), mine)
        torch.testing.assert_close(torch.tensor(r["anchor"]), 2 * _weighted())  # drained


# -- a run through the train task ---------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_diloco_run_through_the_train_task(digits, prefect_harness, hetflow_home):
    from mlflow.tracking import MlflowClient
    from prefect import flow

    import hetflow.tasks.train as train_task
    from hetflow.config import TrackingConfig
    from hetflow.infra.tracking.tracker import MLflowTracker
    from hetflow.training.comm import ring_allreduce_bytes

    from tests.profiles import profile_of, rank_profile

    cluster = ClusterSpec.from_speeds([1, 1, 2], time_scale=2.0)
    train = TrainConfig(
        recipe="digits-mlp",
        global_batch=24,
        steps=24,
        schedule="proportional",
        strategy="diloco",
        diloco={"round_steps": 4},
        eval_every=100,
        target_accuracy=None,
    )
    profile = profile_of([rank_profile(r, s) for r, s in enumerate([100.0, 100.0, 200.0])])

    @flow
    def one_variant():
        return train_task.train_variant("diloco", cluster, digits, train, profile, TrackingConfig())

    out = one_variant()
    assert out.plan.local_batches == [24, 24, 48]  # inner steps 3, 3, 6 of 8 samples
    ranks = out.result.ranks
    assert all(len(r.records) == 6 for r in ranks)  # 24 steps' samples in rounds of 4 steps'
    assert [r.records[0].inner_steps for r in ranks] == [3, 3, 6]
    params = out.result.lead.params
    per_round = ring_allreduce_bytes(4 * params, 3)
    assert all(rec.bytes_sent == pytest.approx(per_round) for rec in ranks[0].records)
    assert out.metrics.final_accuracy > 0.3  # ten classes: it learned
    run = MlflowClient(MLflowTracker(TrackingConfig()).tracking_uri).get_run(out.run_id)
    assert run.data.metrics["rounds"] == 6
    assert run.data.metrics["rank2/inner_steps_per_round"] == 6


def test_a_resumed_outer_step_goes_on_as_the_run_did(outer_ranks):
    for r in (rank["resumed"] for rank in outer_ranks):
        assert r["at"] != [7.0, 7.0, 7.0]  # the model is the checkpoint's anchor
        torch.testing.assert_close(torch.tensor(r["resumed"]), torch.tensor(r["went_on"]))
