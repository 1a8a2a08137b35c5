"""Where the profile history lives and which of its entries a run may use (over `infra.s3`).

Entries (`hetflow.history.TypeEntry`) live next to the cluster profiles, in the dataset's
bucket: `s3://<bucket>/profiles/types/<key slug>/<UTC timestamp>.json`; for a dataset outside
S3, in the default bucket of the local store (`infra.s3.profiles_root`). `write_entries` stores
them; `fresh_entries` finds each key's fresh entry (at most `max_age_h` old, under an equal
key: `cluster_keys`); `newest_real` finds what `hetflow recommend` may read as a real device's
curve. The Prefect tasks that call these (retries, run names) are `tasks.history`'s; the
folder listing is fsspec's (`infra.s3.filesystem`).
"""

from __future__ import annotations

from collections.abc import Iterator

from hetflow.config import ClusterSpec, DatasetSpec, TrainConfig
from hetflow.history import TypeEntry, TypeKey, kind_slug, type_key, versions
from hetflow.infra.s3 import ensure_bucket, filesystem, profiles_root


def types_prefix(dataset: DatasetSpec) -> str:
    """`<profiles_root>/types`: the history of every worker type; for a dataset outside S3,
    the default bucket's, in the local store (`infra.s3.profiles_root`)."""
    return f"{profiles_root(dataset.url)}/types"


def write_entries(entries: list[TypeEntry], prefix: str) -> list[TypeEntry]:
    """Write each entry as `<prefix>/<slug>/<measured_at>.json`; returns them with `stored_at`."""
    ensure_bucket(prefix)
    fs, root = filesystem(prefix)
    out = []
    for e in entries:
        name = f"{e.key.slug()}/{e.measured_at}.json"
        fs.pipe_file(f"{root}/{name}", e.model_dump_json(indent=1).encode())
        out.append(e.model_copy(update={"stored_at": f"{prefix}/{name}"}))
    return out


def entries_newest_first(fs, folder: str, scheme: str) -> Iterator[TypeEntry]:
    """The entries of one key's `folder` that read as one, newest first, each with its URL
    as `stored_at` (an unreadable file is skipped)."""
    try:
        names = sorted(p for p in fs.ls(folder, detail=False) if p.endswith(".json"))
    except FileNotFoundError:
        return
    for path in reversed(names):
        try:
            entry = TypeEntry.model_validate_json(fs.cat_file(path))
        except (OSError, ValueError):  # pydantic's ValidationError is a ValueError
            continue
        yield entry.model_copy(update={"stored_at": f"{scheme}://{path}"})


def latest_entry(prefix: str, key: TypeKey, max_age_h: float) -> TypeEntry | None:
    """The newest readable entry under the key's folder whose key is `key` and which is at
    most `max_age_h` hours old; None when there is none."""
    fs, root = filesystem(prefix)
    entries = entries_newest_first(fs, f"{root}/{key.slug()}", prefix.split("://", 1)[0])
    return next((e for e in entries if e.key == key and e.age_h() <= max_age_h), None)


def fresh_entries(prefix: str, keys: list[TypeKey], max_age_h: float) -> dict[TypeKey, TypeEntry]:
    """The fresh entry (`latest_entry`) of each distinct key that has one."""
    found = {}
    for key in dict.fromkeys(keys):
        entry = latest_entry(prefix, key, max_age_h)
        if entry is not None:
            found[key] = entry
    return found


def cluster_keys(cluster: ClusterSpec, train: TrainConfig) -> list[TypeKey]:
    """Each worker's key, in cluster order."""
    return [type_key(cluster, i, train) for i in range(cluster.world_size)]


def newest_real(url: str, instance_types: list[str], recipe: str) -> dict[str, TypeEntry]:
    """Per instance type, the newest entry under `url` (a types prefix, e.g.
    `s3://<bucket>/profiles/types`) measured on that type without emulation (a real device),
    for `recipe`, by this torch and hetflow, however old; a type with none is absent. Entries
    of other recipes, versions or emulated workers are not read."""
    fs, root = filesystem(url)
    try:
        folders = fs.ls(root, detail=False)
    except FileNotFoundError:
        folders = []
    newest: dict[str, TypeEntry] = {}
    software = versions()
    for name in instance_types:
        for folder in folders:
            if folder.rstrip("/").rsplit("/", 1)[-1][:-17] != kind_slug(name):
                continue
            entry = next(entries_newest_first(fs, folder, url.split("://", 1)[0]), None)
            if entry is not None and stands_for(entry, name, recipe, software):
                if name not in newest or entry.measured_at > newest[name].measured_at:
                    newest[name] = entry
    return newest


def stands_for(entry: TypeEntry, instance_type: str, recipe: str, software) -> bool:
    """Whether `entry` measured a real `instance_type` on `recipe` with `software`, the
    installed (torch, hetflow) versions."""
    key = entry.key
    same = key.kind == instance_type and key.recipe == recipe and key.emulation is None
    return same and (key.torch, key.hetflow) == software
