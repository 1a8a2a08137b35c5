"""What a command checks before its flow starts, so that bad input is refused in one line
before Prefect is imported or its server started.

The flows check the same again where they run (a deployment's flow run has no CLI before it):
the dataset in `tasks.data.ingest_dataset`, the source in `infra.data.ingest.ingest_streamed`,
instance types in `tasks.profile.resolve_instance_types`, Ray's nodes in
`training.launch.ray_train.run_workers_ray`. What cannot be read before the flow is left to
it: data in the S3 endpoint a run starts for itself (nothing configured), which exists only
inside the flow; its error then still ends the command in one line (`hetflow.cli.logs`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hetflow.config import ClusterSpec, DatasetSpec

if TYPE_CHECKING:
    from hetflow.training.job import ResolvedJob


def readable_now(url: str | None) -> bool:
    """Whether `url` can be read before the flow starts: a local path, `file://` or
    `memory://` (this process's), S3 at a configured endpoint or AWS, or S3 in the endpoint a
    run starts for itself, read from the local store it is loaded from (`in_store`)."""
    from hetflow.infra.s3 import s3_target

    if not url or "://" not in url:
        return True
    if url.startswith("s3://"):
        return s3_target(url) is not None or in_store(url) is not None
    return True


def in_store(url: str) -> str | None:
    """Where no S3 is configured, the `file://` URL of `s3://BUCKET/KEY` in the local store
    the run's own endpoint loads (`infra.s3_store`); None for S3 elsewhere, or a key the
    store cannot hold."""
    from hetflow.infra.s3 import s3_target
    from hetflow.infra.s3_store import local_url

    if not url.startswith("s3://") or s3_target(url) is not None:
        return None
    return local_url(url)


def check_instance_types(cluster: ClusterSpec) -> None:
    """Every instance type the cluster's workers name is in the catalog (the shipped snapshot,
    or EC2); a one-line CatalogError naming those it does not know. Offline for the snapshot's
    types; asks no Ray cluster."""
    if any(w.instance_type for w in cluster.workers):
        from hetflow.infra.catalog import Catalog

        Catalog.for_cluster(cluster)


def check_ray_nodes(cluster: ClusterSpec) -> None:
    """Under the Ray launcher, with workers that name instance types: some alive node of the
    Ray cluster carries each type (its label), or a one-line ConfigError naming the worker and
    the types the cluster has. Joins the cluster (`ray.init`), as the run would next."""
    if cluster.launcher != "ray" or not any(w.instance_type for w in cluster.workers):
        return
    import ray

    from hetflow.training.launch.ray_train import connect, label_selectors, ray_address

    connect(ray_address(cluster))
    label_selectors(cluster, ray.nodes())


def check_dataset(dataset: DatasetSpec, job: ResolvedJob) -> None:
    """A dataset the run reads as it is (`--dataset-url`): its manifest and shards are there,
    and the job's recipe reads what it holds; a one-line error otherwise (no such bucket, no
    manifest, with how to write it; a recipe that does not fit). Nothing to check for a
    dataset the flow writes itself, or one it alone can reach (`readable_now`)."""
    if dataset.source != "existing" or not readable_now(dataset.url):
        return
    from hetflow.infra.data.format import DatasetError, read_existing

    stored = in_store(dataset.url)
    try:
        manifest = read_existing(stored or dataset.url)
    except DatasetError as e:  # named as the user wrote it, not as the store holds it
        raise DatasetError(str(e).replace(stored, dataset.url) if stored else str(e)) from None
    job.check_data(manifest)


def check_ingest_source(spec: DatasetSpec) -> None:
    """`hetflow data ingest`'s source can be read (`infra.data.ingest.check_source`): the
    folder exists, holds files to ingest, the Parquet columns named, images in class
    subfolders. Where the source is S3 in the endpoint a run starts, the flow checks it."""
    from hetflow.infra.data.ingest import check_source
    from hetflow.infra.s3 import s3_target

    if spec.source not in ("text", "parquet", "images"):
        return  # digits, synthetic, stdlib: made or found here, nothing a user names
    if (spec.source_url or "").startswith("s3://") and s3_target(spec.url) is None:
        return  # read from the endpoint the flow starts (that of the destination's URL)
    check_source(spec)


def before_flow(job: ResolvedJob, dataset: DatasetSpec) -> None:
    """A job's checks that need its services (`commands.reachable` first): the Ray cluster's
    nodes carry the instance types, the dataset to read is there and the recipe reads it."""
    check_ray_nodes(job.cluster)
    check_dataset(dataset, job)
