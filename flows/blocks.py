"""Clusters and datasets as Prefect blocks: the `ClusterSpec` and `DatasetSpec` block types.

A block is a `ClusterSpec` (or `DatasetSpec`) saved on the Prefect server under a name: the
train, compare and queue forms pick one from a list, and the block's own form (Blocks > +)
creates or edits one. A block is the config model itself (`ClusterBlock` subclasses
`ClusterSpec`), so it validates as a cluster file does; a flow receives a plain `ClusterSpec`
(`ClusterParam`), and a cluster given inline (a file, the CLI, a deployment's parameters)
works as before.

    hetflow stack blocks      # register the types, save the demo's clusters and digits
    prefect block ls          # cluster-spec/demo-1-1-2-4, cluster-spec/queue-6, dataset-spec/digits
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar

from prefect.blocks.core import Block, schema_extra
from pydantic import AfterValidator, BeforeValidator, ConfigDict, model_validator

from hetflow.config import (
    ClusterSpec,
    ConfigModel,
    DatasetSpec,
    default_cluster,
    form_schema,
    offer_choices,
)
from hetflow.config.queue import queue_cluster
from hetflow.infra.catalog import load_snapshot


def by_size(instance_type: str) -> tuple[str, float]:
    """('g5', 2.0) for 'g5.2xlarge': family, then size (xlarge = 1, metal last)."""
    family, _, size = instance_type.partition(".")
    m = re.fullmatch(r"(\d*)xlarge", size)
    return family, (float(m[1] or 1) if m else 0.5 if size == "large" else 1e3)


def catalog_types() -> tuple[str, ...]:
    """The instance types of the shipped catalog snapshot (`infra/instance_types.json`), by
    family and size."""
    return tuple(sorted(load_snapshot(), key=by_size))


# Block document names are slugs (lowercase letters, digits, '-').
DEMO_DATASET = "digits"


def _block_schema(schema: dict[str, Any], model: type[Block]) -> None:
    """Prefect's block schema (its type's slug, secrets) over the config model's form. A
    mapping with a `$ref` is not the block's data: Prefect's server takes a parameter that is
    either, exactly one (`oneOf`), and a block whose fields all have defaults and that takes
    fields the form leaves out would otherwise match a reference too. Prefect's UI leaves the
    `not` out of the schema it has the server check a run form's values against, so a block
    with no required field requires one, which a reference lacks: its `url` where it has one
    (a dataset's: what an API caller giving a dataset inline always names), else its first."""
    form_schema(schema, model)
    said = schema.get("description")
    schema_extra(schema, model)
    if said:
        schema["description"] = said
    schema["not"] = {"required": ["$ref"]}
    if schema.get("properties") and not schema.get("required"):
        props = schema["properties"]
        schema["required"] = ["url"] if "url" in props else [next(iter(props))]


# Set on each block type too: pydantic merges its bases' configs in order, the model's last.
BLOCK_CONFIG = ConfigDict(extra="forbid", validate_assignment=True, json_schema_extra=_block_schema)


class _SpecBlock(Block):
    """What both block types share: the config model's rules (an unknown field is an error),
    and Prefect's `block_type_slug`, which a saved block's data carries, set aside."""

    model_config = BLOCK_CONFIG
    spec: ClassVar[type[ConfigModel]]

    @model_validator(mode="before")
    @classmethod
    def _slug_set_aside(cls, data: Any) -> Any:
        if isinstance(data, dict) and "block_type_slug" in data:
            data = {k: v for k, v in data.items() if k != "block_type_slug"}
        return data

    def as_spec(self) -> ConfigModel:
        """This block as the plain config model the flows and workers pass around."""
        # only what was set: a field left to its default (a worker's speed an instance type
        # will give) must stay unset in the spec the flow resolves
        fields = set(self.spec.model_fields)
        return self.spec.model_validate(self.model_dump(include=fields, exclude_unset=True))


class ClusterBlock(_SpecBlock, ClusterSpec):
    """A cluster's workers and how this machine emulates them (hetflow's `ClusterSpec`)."""

    _block_type_name = "ClusterSpec"
    _block_type_slug = "cluster-spec"
    _description = "A hetflow cluster: its workers and how this machine emulates them."
    model_config = BLOCK_CONFIG
    spec = ClusterSpec

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema, handler):
        """The worker's instance type offers the EC2 catalog's (as the run forms did)."""
        json_schema = handler(core_schema)
        node = handler.resolve_ref_schema(json_schema)
        worker = handler.resolve_ref_schema(node["properties"]["workers"]["items"])
        prop = worker["properties"]["instance_type"]
        worker["properties"]["instance_type"] = offer_choices(
            prop, catalog_types(), "catalog", "another EC2 type"
        )
        return json_schema


class DatasetBlock(_SpecBlock, DatasetSpec):
    """Where a dataset lives (shards + manifest) and how workers read it (`DatasetSpec`)."""

    _block_type_name = "DatasetSpec"
    _block_type_slug = "dataset-spec"
    _description = "A hetflow dataset: where its shards live and how the workers read them."
    model_config = BLOCK_CONFIG
    spec = DatasetSpec


def _inline(block_type: type[_SpecBlock]):
    def to_data(value: Any) -> Any:
        if isinstance(value, block_type.spec) and not isinstance(value, block_type):
            return value.model_dump(exclude_unset=True)
        return value

    return BeforeValidator(to_data)


def _plain(block: _SpecBlock) -> ConfigModel:
    return block.as_spec()


# A flow parameter: a saved block picked in the form (`{"$ref": ...}`, which Prefect loads), a
# mapping (a cluster file, a deployment's parameters) or a ClusterSpec; the flow gets a ClusterSpec.
ClusterParam = Annotated[ClusterBlock, _inline(ClusterBlock), AfterValidator(_plain)]
DatasetParam = Annotated[DatasetBlock, _inline(DatasetBlock), AfterValidator(_plain)]


def demo_blocks() -> dict[str, _SpecBlock]:
    """The blocks `hetflow stack blocks` saves, by slug: the demo's and the queue's clusters,
    the digits dataset (each the flows' default, so a form's pick runs what a bare run does)."""
    clusters = [default_cluster(), queue_cluster()]
    out: dict[str, _SpecBlock] = {
        f"cluster-spec/{c.name}": ClusterBlock.model_validate(c.model_dump()) for c in clusters
    }
    out[f"dataset-spec/{DEMO_DATASET}"] = DatasetBlock.model_validate(DatasetSpec().model_dump())
    return out


def save_demo_blocks(overwrite: bool = False, sync: bool | None = None) -> list[str]:
    """Register both block types with the Prefect API and save `demo_blocks` that are not
    there yet (a user's edits are kept unless `overwrite`); returns the slugs saved. `sync`:
    force Prefect's sync calls (inside its event loop), else as the context decides."""
    how = {} if sync is None else {"_sync": sync}
    ClusterBlock.register_type_and_schema(**how)
    DatasetBlock.register_type_and_schema(**how)
    saved = []
    for slug, block in demo_blocks().items():
        name = slug.split("/", 1)[1]
        if not overwrite and _exists(type(block), name, how):
            continue
        block.save(name, overwrite=overwrite, **how)
        saved.append(slug)
    return saved


def _exists(block_type: type[_SpecBlock], name: str, how: dict) -> bool:
    try:
        block_type.load(name, **how)
    except ValueError:
        return False
    return True


def register_step() -> dict[str, list[str]]:
    """prefect.yaml's build step (`hetflow.flows.blocks.register_step`): what `prefect deploy`
    runs first, so that the forms' block types and the demo's blocks exist wherever the
    deployments do. Runs in a thread of Prefect's event loop: the calls are made sync."""
    return {"saved": save_demo_blocks(sync=True)}


if __name__ == "__main__":  # `hetflow stack up` runs this against the stack's Prefect
    import json

    print(json.dumps(save_demo_blocks()))
