"""Clusters and datasets as Prefect blocks, against a real Prefect API (the
session's `prefect_test_harness`): the demo's blocks saved once, picked by a run's form as a
reference the flow loads, validated as a cluster file is, and edited without losing a rule."""

from __future__ import annotations

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import BlockDocumentCreate
from prefect.exceptions import ParameterTypeError
from prefect.utilities.callables import parameter_schema
from prefect.utilities.schema_tools.validation import validate

from hetflow.config import ClusterSpec, DatasetSpec
from hetflow.config.cluster import preset_speed
from hetflow.config.queue import queue_cluster
from hetflow.flows.blocks import ClusterBlock, DatasetBlock, demo_blocks, save_demo_blocks
from hetflow.flows.job_queue import queue
from hetflow.flows.train import train


@pytest.fixture(scope="module")
def saved(prefect_harness):
    return save_demo_blocks(overwrite=True)


def test_the_demos_clusters_and_digits_are_saved_once(saved):
    assert saved == list(demo_blocks())
    assert "cluster-spec/demo-1-1-2-4" in saved and "dataset-spec/digits" in saved
    assert save_demo_blocks() == []  # already there: a user's edits are kept
    assert ClusterBlock.load("queue-6").as_spec() == queue_cluster()
    assert DatasetBlock.load("digits").as_spec() == DatasetSpec()


def test_a_run_picks_a_block_by_reference_and_gets_the_plain_model(saved):
    by_slug = {"$ref": {"block_document_slug": "cluster-spec/queue-6"}}
    by_id = {"$ref": {"block_document_id": str(ClusterBlock.load("queue-6")._block_document_id)}}
    digits = {"$ref": {"block_document_slug": "dataset-spec/digits"}}
    schema = parameter_schema(queue.fn).model_dump_for_openapi()
    for ref in (by_slug, by_id):  # what the UI's picker sends, and what prefect.yaml may name
        validate({"cluster": ref, "dataset": digits}, schema, raise_on_error=True)
        ran = queue.validate_parameters({"cluster": ref, "dataset": digits})
        assert type(ran["cluster"]) is ClusterSpec and ran["cluster"] == queue_cluster()
        assert type(ran["dataset"]) is DatasetSpec and ran["dataset"] == DatasetSpec()


def test_a_block_saved_through_the_api_is_checked_when_a_run_loads_it(saved):
    """The UI's block form checks the JSON schema only; a rule it cannot express (unique
    worker names) stops the run that loads the block, naming it, before anything starts."""
    block_type = ClusterBlock.register_type_and_schema() or ClusterBlock
    with get_client(sync_client=True) as client:
        doc = client.create_block_document(
            BlockDocumentCreate(
                name="twice",
                data={"name": "twice", "workers": [{"name": "a"}, {"name": "a"}]},
                block_schema_id=block_type._block_schema_id,
                block_type_id=block_type._block_type_id,
            )
        )
    with pytest.raises(ParameterTypeError) as refused:
        train.validate_parameters({"cluster": {"$ref": {"block_document_id": str(doc.id)}}})
    chain, e = [], refused.value
    while e is not None:
        chain.append(str(e))
        e = e.__cause__
    assert any("worker name 'a' appears twice" in said for said in chain), chain


def test_a_preset_changed_in_a_saved_block_brings_its_speed(saved):
    block = ClusterBlock.load("queue-6")
    data = block.model_dump(exclude={"block_type_slug"})
    assert "speed" not in data["workers"][0]  # the block keeps no derived speed
    data["workers"][0]["preset"] = "a100"
    ClusterBlock.model_validate(data).save("queue-6-a100", overwrite=True)
    ran = queue.validate_parameters(
        {"cluster": {"$ref": {"block_document_slug": "cluster-spec/queue-6-a100"}}}
    )
    assert ran["cluster"].workers[0].speed == preset_speed("a100")
