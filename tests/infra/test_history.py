"""The profile history per worker type: keys, the assembled profile, and the runs that reuse it.

The fast tests replace `measure_profile` (the torchrun profile, tested in test_probes.py) by a
stand-in that records the cluster it was asked to measure; the history itself is real S3 over
moto's HTTP server. The slow test trains twice through the train flow with real profiles.
"""

from __future__ import annotations

import datetime as dt

import pytest

import hetflow.history.store as history_store
import hetflow.tasks.history as history_task
from hetflow.config import ClusterSpec, DatasetSpec, TrainConfig
from hetflow.history import MEASURED_NOW, TypeEntry, type_key
from hetflow.infra.s3 import filesystem, local_s3_endpoint
from hetflow.perf.collective import ring_allreduce_time
from hetflow.records import Profile
from hetflow.tasks.profile import profiles_prefix
from hetflow.training.plan.assemble import assemble, ring_figures, sub_cluster

from tests.profiles import profile_of, rank_profile

pytestmark = pytest.mark.timeout(240)
TRAIN = TrainConfig(global_batch=32)


def fake_measure():
    """A stand-in for `measure_profile`: each worker at 100 x its speed samples/s, a link of
    its own; `launched` keeps the clusters it measured."""

    def measure(cluster, dataset, train, run_dir, profile_batches=None, placement=None):
        ranks = [
            rank_profile(
                i,
                100.0 * w.speed,
                worker=w.name,
                relative_speed=w.speed / max(v.speed for v in cluster.workers),
                fit_latency_s=0.01,
                grad_bytes=400_000,
                link_gbps=2.0 + i,
                link_latency_s=1e-4 * (i + 1),
                memory_cap_batch=1000 + i,
            )
            for i, w in enumerate(cluster.workers)
        ]
        measure.launched.append((cluster, profile_batches))
        return profile_of(ranks, cluster=cluster.name, profiling_time_s=5.0)

    measure.launched = []
    return measure


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


@pytest.fixture
def dataset(s3, hetflow_home, request):
    return DatasetSpec(url=f"s3://hetflow-history-{request.node.name[5:30].replace('_', '-')}/d")


def test_a_second_run_reuses_the_history_and_a_new_type_is_profiled_on_one_worker(
    dataset, prefect_harness, monkeypatch
):
    measure = fake_measure()
    monkeypatch.setattr(history_task, "measure_profile", measure)
    cluster = ClusterSpec.from_speeds([1, 1, 2])
    first = history_task.profile_or_reuse.fn(cluster, dataset, TRAIN)
    # nothing known: the whole cluster, as before the history
    (part, batches), *_ = measure.launched
    assert part == cluster and batches is None and first.sources == [MEASURED_NOW] * 3
    assert first.profiling_time_s == 5.0

    second = history_task.profile_or_reuse.fn(cluster, dataset, TRAIN)
    assert len(measure.launched) == 1 and second.profiling_time_s == 0.0
    assert all(s.startswith("s3://") and "/profiles/types/speed-" in s for s in second.sources)
    assert second.sources[0] == second.sources[1]  # one entry per type: w0's
    assert [r.memory_cap_batch for r in second.ranks] == [1000, 1000, 1002]

    grown = ClusterSpec.from_speeds([1, 1, 2, 1.5])  # one new type, the same fastest
    grown.workers[3].link_gbps = 4.0
    third = history_task.profile_or_reuse.fn(grown, dataset, TRAIN)
    (part, _) = measure.launched[-1]
    assert len(measure.launched) == 2 and [w.name for w in part.workers] == ["w3"]
    assert part.slowdowns() == pytest.approx([grown.slowdowns()[3]])  # dilated as in `grown`
    assert third.sources[3] == MEASURED_NOW and third.sources[0] == second.sources[0]
    # measured alone: its link is the declared one, on the emulated clock
    assert third.ranks[3].link_gbps == 4.0 / grown.time_scale and third.profiling_time_s == 5.0

    faster = ClusterSpec.from_speeds([1, 1, 2, 8])  # a new fastest dilates every worker anew
    history_task.profile_or_reuse.fn(faster, dataset, TRAIN)
    assert measure.launched[-1][0] == faster
    twins = ClusterSpec.from_speeds([1, 1, 2, 8, 5, 5])  # one new type, on two workers
    fourth = history_task.profile_or_reuse.fn(twins, dataset, TRAIN)
    (part, batches) = measure.launched[-1]
    assert [w.name for w in part.workers] == ["w4"] and batches == [1, 2, 4, 8, 16, 32]
    assert fourth.sources[4:] == [MEASURED_NOW, f"{MEASURED_NOW} (as w4)"]


def test_a_dataset_in_a_local_folder_keeps_its_history_in_the_local_store(
    tmp_path, hetflow_home, prefect_harness, monkeypatch
):
    """Not under the filesystem's root (a `file://` URL's "bucket"): in the default bucket,
    which the local store keeps for the next command."""
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    measure = fake_measure()
    monkeypatch.setattr(history_task, "measure_profile", measure)
    dataset = DatasetSpec(url=(tmp_path / "mydata").as_uri())
    cluster = ClusterSpec.from_speeds([1, 2])
    prefix = profiles_prefix(dataset, cluster, "a.b:C")
    assert prefix == f"s3://hetflow-data/profiles/{cluster.name}/a.b.C"
    with local_s3_endpoint(dataset.url):
        history_task.profile_or_reuse.fn(cluster, dataset, TRAIN)
    stored = sorted((hetflow_home / "s3/hetflow-data/profiles/types").glob("speed-*/*.json"))
    assert len(stored) == 2
    with local_s3_endpoint(dataset.url):  # the next command: a new endpoint, the store's objects
        again = history_task.profile_or_reuse.fn(cluster, dataset, TRAIN)
    assert len(measure.launched) == 1 and again.profiling_time_s == 0.0
    assert all(s.startswith("s3://hetflow-data/profiles/types/speed-") for s in again.sources)


def test_a_stale_or_mismatched_entry_is_not_used(dataset, prefect_harness, monkeypatch):
    measure = fake_measure()
    monkeypatch.setattr(history_task, "measure_profile", measure)
    cluster = ClusterSpec.from_speeds([1, 2])
    history_task.profile_or_reuse.fn(cluster, dataset, TRAIN)
    other_recipe = TRAIN.model_copy(update={"recipe": "digits-mlp"})
    history_task.profile_or_reuse.fn(cluster, dataset, other_recipe)
    assert len(measure.launched) == 2  # another recipe: measured again

    monkeypatch.setattr(history_store, "type_key", lambda *a: type_key(*a, torch="0.0.1"))
    history_task.profile_or_reuse.fn(cluster, dataset, TRAIN)
    assert len(measure.launched) == 3  # another torch version
    monkeypatch.setattr(history_store, "type_key", type_key)

    # every stored entry 30 hours old: older than a day, measured again
    fs, root = filesystem(history_store.types_prefix(dataset))
    old = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=30)).strftime("%Y%m%dT%H%M%S%fZ")
    for path in fs.find(root):
        entry = TypeEntry.model_validate_json(fs.cat_file(path))
        fs.pipe_file(path, entry.model_copy(update={"measured_at": old}).model_dump_json().encode())
    history_task.profile_or_reuse.fn(cluster, dataset, TRAIN)
    assert len(measure.launched) == 4
    reused = history_task.profile_or_reuse.fn(cluster, dataset, TRAIN)  # the fresh ones now
    assert len(measure.launched) == 4 and reused.profiling_time_s == 0.0
    never = TRAIN.model_copy(update={"profile_max_age_h": 0})  # 0: always measure
    always = history_task.profile_or_reuse.fn(cluster, dataset, never)
    assert len(measure.launched) == 5 and always.sources == [MEASURED_NOW] * 2


def test_the_profile_flow_writes_an_entry_per_type_and_tags_its_run(
    dataset, prefect_harness, monkeypatch
):
    from mlflow.tracking import MlflowClient

    import hetflow.flows.profile_cluster as profile_flow
    from hetflow.config import TrackingConfig
    from hetflow.infra.tracking.tracker import MLflowTracker

    measure = fake_measure()
    monkeypatch.setattr(
        profile_flow, "profile_workers", lambda c, d, t, job: measure(c, d, t, "profile-dir")
    )
    monkeypatch.setattr(history_task, "measure_profile", measure)
    cluster = ClusterSpec.from_speeds([1, 1, 2])
    out = profile_flow.profile_cluster(cluster=cluster, dataset=dataset, train=TRAIN)
    tags = (
        MlflowClient(MLflowTracker(TrackingConfig()).tracking_uri)
        .get_run(out["mlflow_run_id"])
        .data.tags
    )
    urls = {k: v for k, v in tags.items() if k.startswith("history.")}
    assert len(urls) == 2 and all(
        v.startswith(history_store.types_prefix(dataset)) for v in urls.values()
    )
    assert out["sources"] == [MEASURED_NOW] * 3
    history_task.profile_or_reuse.fn(cluster, dataset, TRAIN)  # a train run after it
    assert len(measure.launched) == 1  # the flow's profile only


def test_profile_records_say_where_each_worker_came_from():
    p = Profile.model_validate_json(
        profile_of([rank_profile(0, 1.0)], sources=["s3://b/x (1.0 h old)"]).model_dump_json()
    )
    assert p.sources == ["s3://b/x (1.0 h old)"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_training_twice_profiles_once_and_the_second_run_names_the_entries(
    digits, prefect_harness, monkeypatch
):
    from mlflow.tracking import MlflowClient

    from hetflow.config import TrackingConfig
    from hetflow.flows.train import train
    from hetflow.infra.tracking.tracker import MLflowTracker

    launched = []
    real = history_task.measure_profile

    def counted(cluster, *args, **kw):
        launched.append([w.name for w in cluster.workers])
        return real(cluster, *args, **kw)

    monkeypatch.setattr(history_task, "measure_profile", counted)
    cluster = ClusterSpec.from_speeds([1, 1, 4], time_scale=2.0)
    cfg = TrainConfig(
        recipe="digits-mlp", steps=4, global_batch=32, eval_every=2, profile_first=True
    )
    first = train(cluster=cluster, dataset=digits, train=cfg, tracking=TrackingConfig())
    assert launched == [["w0", "w1", "w2"]]  # nothing known: every worker
    second = train(cluster=cluster, dataset=digits, train=cfg, tracking=TrackingConfig())
    assert launched == [["w0", "w1", "w2"]]  # nothing launched: every type known
    assert first["metrics"]["profiling_time_s"] > 0 == second["metrics"]["profiling_time_s"]

    client = MlflowClient(MLflowTracker(TrackingConfig()).tracking_uri)
    tags = client.get_run(second["run_id"]).data.tags
    sources = [tags[f"profile_source.{w.name}"] for w in cluster.workers]
    assert all(s.startswith("s3://hetflow-history/profiles/types/speed-") for s in sources)
    assert sources[0] == sources[1] != sources[2]
    first_tags = client.get_run(first["run_id"]).data.tags
    assert first_tags["profile_source.w1"] == MEASURED_NOW


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
