"""The profile history per worker type: keys, the assembled profile, and the runs that reuse it.

The fast tests replace `measure_profile` (the torchrun profile, tested in test_probes.py) by a
stand-in that records the cluster it was asked to measure; the history itself is real S3 over
moto's HTTP server. The slow test trains twice through the train flow with real profiles.
"""

from __future__ import annotations

import pytest

import hetflow.tasks.history as history_task
from hetflow.config import ClusterSpec, TrainConfig
from hetflow.history import MEASURED_NOW, type_key
from hetflow.perf.collective import ring_allreduce_time
from hetflow.records import Profile
from hetflow.training.plan.assemble import assemble, ring_figures, sub_cluster

from tests.helpers.infra.history import TRAIN
from tests.profiles import profile_of, rank_profile

pytestmark = pytest.mark.timeout(240)


def test_a_key_changes_with_the_recipe_the_versions_and_the_emulated_slowdown():
    c = ClusterSpec.from_speeds([1, 2, 2])
    key = type_key(c, 1, TRAIN, host="h", torch="2.5.1")
    assert key == type_key(c, 2, TRAIN, host="h", torch="2.5.1")
    assert key != type_key(c, 1, TRAIN, host="h", torch="2.6.0")
    assert key != type_key(c, 1, TRAIN.model_copy(update={"recipe": "digits-mlp"}), host="h")
    assert key != type_key(c, 1, TRAIN, host="other", torch="2.5.1")
    faster = ClusterSpec.from_speeds([1, 2, 4])  # the same speed, dilated more: not the same
    assert key != type_key(faster, 1, TRAIN, host="h", torch="2.5.1")
    assert key.slug() != type_key(c, 0, TRAIN, host="h", torch="2.5.1").slug()


def test_a_sub_cluster_keeps_each_workers_emulated_slowdown_link_and_key():
    c = ClusterSpec.from_speeds([1, 2, 4])
    c.workers[0].link_gbps, c.workers[0].link_latency_ms = 1.0, 0.5
    part = sub_cluster(c, [0, 1])
    assert part.slowdowns() == pytest.approx([c.slowdowns()[0], c.slowdowns()[1]])
    assert part.time_scale == 2 * c.time_scale
    for j, i in enumerate([0, 1]):
        assert type_key(part, j, TRAIN, host="h") == type_key(c, i, TRAIN, host="h")


def test_assemble_recomputes_speeds_at_this_clusters_batch_and_models_the_ring():
    c = ClusterSpec.from_speeds([1, 2, 4])
    measured = [
        rank_profile(
            5, s, worker="x", fit_latency_s=0.01, link_gbps=g, link_latency_s=a, grad_bytes=10**6
        )
        for s, g, a in ((100.0, 4.0, 1e-4), (200.0, 2.0, 3e-4), (400.0, 8.0, 2e-4))
    ]
    p = assemble(c, TRAIN, measured, ["a", "b", "c"], profiling_time_s=1.5)
    ref = 32 // 3
    assert [r.rank for r in p.ranks] == [0, 1, 2]
    assert [r.worker for r in p.ranks] == [w.name for w in c.workers]
    assert p.ranks[0].samples_per_s == pytest.approx(ref / (0.01 + ref / 100))
    assert p.ranks[2].relative_speed == 1.0 and p.ranks[0].relative_speed < 0.5
    ring = ring_allreduce_time(10**6, 3, 3e-4, 2.0)  # the slowest hop, the narrowest link
    assert [r.grad_allreduce_s for r in p.ranks] == pytest.approx([ring] * 3)
    assert p.sources == ["a", "b", "c"] and p.profiling_time_s == 1.5
    assert ring_figures(measured[:1])["grad_allreduce_s"] == 0.0


def test_profile_records_say_where_each_worker_came_from():
    p = Profile.model_validate_json(
        profile_of([rank_profile(0, 1.0)], sources=["s3://b/x (1.0 h old)"]).model_dump_json()
    )
    assert p.sources == ["s3://b/x (1.0 h old)"]


def test_a_comparison_says_when_its_profile_was_reused_and_what_it_charged():
    from hetflow.flows.compare import reuse_note

    ranks = [rank_profile(i, 100.0, worker=f"w{i}") for i in range(3)]
    fresh = profile_of(ranks, profiling_time_s=12.0)
    fresh.sources = [MEASURED_NOW, f"{MEASURED_NOW} (as w0)", MEASURED_NOW]
    assert reuse_note(fresh) == []
    part = profile_of(ranks, profiling_time_s=4.5)
    part.sources = [
        "s3://b/profiles/types/speed-1-x/1.json (2.0 h old)",
        MEASURED_NOW,
        MEASURED_NOW,
    ]
    (note,) = reuse_note(part)
    assert note.startswith("the profile of 1 of 3 workers was reused from the profile history")
    assert "charged 4.5 s of profiling" in note and "w0 (s3://b/profiles/types/" in note


def test_the_prior_note_names_the_curves_of_several_presets_as_one_list():
    from hetflow.training.plan.prior import published_prior

    prior = published_prior(ClusterSpec.from_speeds(["t4", "v100"]), TrainConfig())
    assert history_task.prior_note(prior) == [
        "the optimized run profiled nothing before its first step: it planned step 0 from the "
        "published curve of preset t4 and the published curve of preset v100, and re-planned "
        "from its own steps"
    ]
