"""The shares a job re-cuts when a worker joins it in place (`training.elastic.shares`): the
joiner's curve until its own steps teach it, and the global batch over the members."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hetflow.records import Plan
from hetflow.training.elastic.shares import joiner_curve, replan
from hetflow.training.plan.rebalancer import Rebalancer


def _spec(kinds, prior=()):
    workers = [SimpleNamespace(instance_type=k, preset=None) for k in kinds]
    plan = SimpleNamespace(per_sample_s=list(prior))
    return SimpleNamespace(cluster=SimpleNamespace(workers=workers), plan=plan)


def _rebalancer(per_sample_s):
    r = Rebalancer(64, [None] * len(per_sample_s), [0.01] * len(per_sample_s), per_sample_s)
    r.points = [{16: 0.1}, {16: 0.2}, {16: 0.4}, {}]  # rank 3 never measured
    return r


def test_a_joiner_takes_the_curve_of_a_member_of_its_type():
    r = _rebalancer([0.001, 0.002, 0.004, 0.0])
    joiner_curve(r, 3, (0, 1, 2, 3), _spec(["a", "b", "c", "b"]))
    assert r.per_sample_s[3] == 0.002


def test_else_its_prior_in_the_members_measured_units():
    r = _rebalancer([0.001, 0.002, 0.004, 0.0])
    # the prior says rank 3 is twice rank 0's pace; measured paces are 10x the prior's
    joiner_curve(r, 3, (0, 1, 2, 3), _spec([None] * 4, [0.0001, 0.0002, 0.0004, 0.0002]))
    assert r.per_sample_s[3] == pytest.approx(0.002)


def test_else_the_members_median_and_a_measured_joiner_is_kept():
    r = _rebalancer([0.001, 0.002, 0.004, 0.0])
    joiner_curve(r, 3, (0, 1, 2, 3), _spec([None] * 4))
    assert r.per_sample_s[3] == 0.002
    r.points[3] = {16: 0.05}
    r.per_sample_s[3] = 0.0005
    joiner_curve(r, 3, (0, 1, 2, 3), _spec([None] * 4))
    assert r.per_sample_s[3] == 0.0005  # its own steps measured it: its curve stays


def test_a_joiner_without_a_share_gets_its_launch_share_in_the_proportional_cut():
    r = Rebalancer(64, [None] * 4, [0.0] * 4)
    launch = Plan.equal([16, 16, 16, 16])
    # weights 16, 16, 32 and the joiner's launch share 16, by largest remainders
    assert replan(r, [16, 16, 32, 0], (0, 1, 2, 3), 64, launch) == [13, 13, 25, 13]
