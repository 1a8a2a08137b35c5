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
from hetflow.tasks.profile import profiles_prefix

from tests.helpers.infra import history as _shared
from tests.helpers.infra.history import TRAIN, fake_measure

# the shared fixtures
dataset = _shared.dataset


pytestmark = pytest.mark.timeout(240)


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
