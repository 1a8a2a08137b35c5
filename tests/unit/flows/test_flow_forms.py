"""The Prefect run forms: each flow's parameter schema, as `prefect deploy`
stores it and the UI renders it, holds what a person chooses for one run (about a dozen
fields, each titled and described; the cluster and dataset picked among saved blocks), offers
lists where the values are known, shows an optional field as one input, keeps a worker to a
few fields in the cluster block's form; and Prefect's server still accepts what it did."""

from __future__ import annotations

import pytest
import yaml
from prefect.utilities.callables import parameter_schema
from prefect.utilities.schema_tools.validation import ValidationError, validate

from hetflow.config import (
    BUILTIN_RECIPES,
    ClusterSpec,
    DatasetSpec,
    TrainConfig,
    WorkerSpec,
)
from hetflow.emulation.presets import PRESETS
from hetflow.flows.blocks import ClusterBlock
from hetflow.flows.compare import compare
from hetflow.flows.forms import COMPARE_FIELDS, COMPRESSION_CHOICES, TRAIN_FIELDS
from hetflow.flows.job_queue import queue
from hetflow.flows.prepare_dataset import prepare_dataset
from hetflow.flows.profile_cluster import profile_cluster
from hetflow.flows.recommend import recommend
from hetflow.flows.train import train
from hetflow.infra.catalog import load_snapshot

from tests.helpers.cli.cli import LAB_NOTE

FLOWS = {f.name: f for f in (train, compare, profile_cluster, prepare_dataset, recommend, queue)}
RUN_FORMS = ("train", "compare", "queue")
MOST_FIELDS = 12  # a run form's inputs, the cluster and dataset pickers one each
# A worker's fields in the form: its name, what it is (an EC2 type, a device preset or a
# relative speed), its device and its emulated link. Six, so that the demo's 4 workers are 24
# fields, not 52; the rest (node, precision, cores, memory cap, link latency, the emulated
# curve's knee and fixed cost) override what is measured or derived, and stay in YAML.
WORKER_FIELDS = 6


def schema_of(flow) -> dict:
    """What `prefect deploy` stores as the deployment's parameter_openapi_schema."""
    return parameter_schema(flow.fn).model_dump_for_openapi()


def resolve(prop: dict, defs: dict) -> dict:
    return {**defs[prop["$ref"].split("/")[-1]], **prop} if "$ref" in prop else prop


def fields(schema: dict) -> dict[str, dict]:
    """Every input the form draws, by dotted path (`train.recipe`, `cluster.workers[].name` in
    a block's own form): the leaves under the parameters, through nested models and lists of
    models; a block (a definition with a `block_type_slug`) is one input, a list to pick from,
    as Prefect's UI draws it."""
    defs, out = schema.get("definitions", {}), {}

    def walk(prop: dict, path: str) -> None:
        prop = resolve(prop, defs)
        items = resolve(prop.get("items", {}), defs)
        if "properties" in items:
            prop, path = items, path + "[]"
        if "properties" not in prop or (path and "block_type_slug" in prop):
            out[path] = prop
            return
        for name, sub in prop["properties"].items():
            walk(sub, f"{path}.{name}" if path else name)

    walk(schema, "")
    return out


def listed(prop: dict) -> list:
    """The values a field offers in a list (its enum, or its list branch)."""
    return prop.get("enum") or next((b["enum"] for b in prop.get("anyOf", []) if "enum" in b), [])


@pytest.fixture(scope="module")
def schemas() -> dict[str, dict]:
    return {name: schema_of(f) for name, f in FLOWS.items()}


def test_an_optional_field_is_one_input_not_a_none_toggle(schemas):
    for name, schema in schemas.items():
        for path, prop in fields(schema).items():
            where = f"{name}: {path}"
            assert prop.get("default", ...) is not None, f"{where}: the form would fill in null"
            nulls = [b for b in prop.get("anyOf", []) if b.get("type") == "null"]
            if nulls:  # None besides another default (target_accuracy): a choice, titled
                assert "default" in prop and nulls[0].get("title") == "none", where
    toggles = [
        (name, path)
        for name, schema in schemas.items()
        for path, prop in fields(schema).items()
        if any(b.get("type") == "null" for b in prop.get("anyOf", []))
    ]
    assert {path for _, path in toggles} <= {"train.target_accuracy"}, toggles
    lr = TrainConfig.model_json_schema()["properties"]["lr"]  # empty: the recipe's
    assert lr["type"] == "number" and "default" not in lr and "Empty" in lr["description"]


def test_known_sets_are_lists_with_the_catalogs_values(schemas):
    form = fields(schemas["compare"]) | block_fields()
    instance = form["cluster.workers[].instance_type"]
    assert sorted(listed(instance)) == sorted(load_snapshot())  # the catalog, offline
    assert [b["title"] for b in instance["anyOf"]] == ["catalog", "another EC2 type"]
    assert listed(form["cluster.workers[].preset"]) == list(PRESETS)
    assert listed(form["cluster.workers[].device"]) == ["auto", "cuda", "cpu"]
    assert listed(form["cluster.launcher"]) == ["local", "ray"]
    recipe = form["train.recipe"]
    assert listed(recipe) == list(BUILTIN_RECIPES)
    assert (
        recipe["anyOf"][1]["pattern"]
        == TrainConfig.model_json_schema()["properties"]["recipe"]["pattern"]
    )  # your own Recipe class, by import path
    assert listed(fields(schemas["train"])["train.compression"]) == list(COMPRESSION_CHOICES)
    for method in COMPRESSION_CHOICES:  # each one listed is one the config takes as it is
        assert TrainConfig(compression=method).compression == method


def block_schema() -> dict:
    """The ClusterSpec block's own form (Blocks > ClusterSpec), as Prefect registers it."""
    return ClusterBlock.model_json_schema()


def block_fields() -> dict[str, dict]:
    """The inputs of the ClusterSpec block's form, by path under `cluster.`."""
    return {f"cluster.{path}": prop for path, prop in fields(block_schema()).items()}


def test_recommend_lists_exactly_what_it_can_price_and_time(schemas):
    from hetflow.forecast.rent import rental
    from hetflow.forecast.rent.search import Job
    from hetflow.forecast.simulate.models import MODELS, NAMES, OLD_NAMES
    from hetflow.infra.market import load_market

    market = load_market()
    form = fields(schemas["recommend"])
    assert listed(form["job.recipe"]) == list(NAMES)  # each model once, by its recipe's name
    assert set(NAMES) | set(OLD_NAMES) == set(MODELS)
    offered = listed(form["candidates[].instance_type"])
    job = Job(rental.model_of("resnet50"), global_batch=8, steps=1)
    rental.candidates([(t, 1) for t in offered], job, market)  # every one listed can be recommended
    for t in set(load_snapshot()) - set(offered):
        with pytest.raises(rental.RecommendError):
            rental.candidates([(t, 1)], job, market)


def test_descriptions_state_contracts_not_lab_notes(schemas):
    for name, schema in schemas.items():
        texts = {path: prop.get("description", "") for path, prop in fields(schema).items()}
        texts |= {k: d.get("description", "") for k, d in schema.get("definitions", {}).items()}
        for path, text in texts.items():
            assert not LAB_NOTE.search(text), f"{name}: {path}: {text}"


def test_the_forms_restart_default_is_the_spot_models():
    from hetflow.config import RecommendMarket
    from hetflow.forecast.rent.spot import SPOT_RESTART_S

    said = RecommendMarket.model_fields["restart_s"].description
    assert f"empty: {SPOT_RESTART_S:g} s," in said


# What a user changes first in a run form, in this order, before anything else (the model and
# its steps, not the cluster's or the dataset's finer settings).
FIRST_FIELDS = ("recipe", "steps", "global_batch")


@pytest.mark.parametrize("name", ["train", "compare"])
def test_the_form_opens_on_the_fields_a_user_changes_first(schemas, name):
    """Prefect draws the parameters by `position` and a model's fields by theirs."""
    schema = schemas[name]
    assert min(schema["properties"], key=lambda k: schema["properties"][k]["position"]) == "train"
    shown = schema["definitions"]["TrainConfig"]["properties"]
    in_order = sorted(shown, key=lambda k: shown[k]["position"])
    assert tuple(in_order[: len(FIRST_FIELDS)]) == FIRST_FIELDS


@pytest.mark.parametrize("name", RUN_FORMS)
def test_a_run_form_is_about_a_dozen_titled_described_fields(schemas, name):
    schema = schemas[name]
    form = fields(schema)
    assert len(form) <= MOST_FIELDS, list(form)
    shown = {**schema["properties"], **form}  # each parameter, and each input under it
    for path, prop in shown.items():
        assert prop.get("title") and prop["title"] != path, f"{name}: {path}: no title"
        said = prop.get("description", "")
        assert said and "\n" not in said and len(said) <= 240, f"{name}: {path}: {said!r}"


# The inputs of the forms that are not run forms, as they are: a form that grows fails here.
OTHER_FORMS = {"profile-cluster": 15, "prepare-dataset": 14, "recommend": 22}  # + precision


def test_each_deployment_of_prefect_yaml_renders_its_form_and_counts_its_fields(
    schemas, monkeypatch
):
    """Every deployment prefect.yaml declares, its flow loaded from its entrypoint as `prefect
    deploy` loads it: its schema is the one the other tests read, and its inputs are counted
    (the run forms' at most MOST_FIELDS, the others' at most OTHER_FORMS')."""
    from pathlib import Path

    from prefect.flows import load_flow_from_entrypoint

    root = Path(__file__).resolve().parents[3]
    monkeypatch.chdir(root)
    declared = yaml.safe_load((root / "prefect.yaml").read_text())["deployments"]
    counted = {}
    for d in declared:
        schema = schema_of(load_flow_from_entrypoint(d["entrypoint"]))
        assert schema == schemas[d["name"]], d["name"]
        counted[d["name"]] = len(fields(schema))
    assert set(counted) == set(RUN_FORMS) | set(OTHER_FORMS)
    assert all(counted[n] <= MOST_FIELDS for n in RUN_FORMS), counted
    assert all(counted[n] <= most for n, most in OTHER_FORMS.items()), counted


@pytest.mark.parametrize("name", RUN_FORMS)
def test_the_cluster_and_dataset_are_picked_among_saved_blocks(schemas, name):
    form = fields(schemas[name])
    assert form["cluster"]["block_type_slug"] == "cluster-spec"
    assert form["dataset"]["block_type_slug"] == "dataset-spec"
    assert not [p for p in form if p.startswith(("cluster.", "dataset.", "tracking"))]


def without_not(schema):
    """The schema as Prefect's UI sends it with a run form's values to the server's check
    (`/ui/schemas/validate`): its schema model has no `not`."""
    if isinstance(schema, dict):
        return {k: without_not(v) for k, v in schema.items() if k != "not"}
    return [without_not(v) for v in schema] if isinstance(schema, list) else schema


@pytest.mark.parametrize("name", RUN_FORMS)
def test_blocks_picked_in_a_run_form_pass_the_check_the_ui_asks_for(schemas, name):
    """A picked block is `{"$ref": {...}}`; Prefect checks it against `oneOf` [a reference,
    the block's fields]: exactly one must match, with or without the schema's `not`."""
    picked = {"$ref": {"block_document_id": "ae12ab32-7318-4435-a644-16d0c8b12e50"}}
    values = {k: picked for k in ("cluster", "dataset") if k in schemas[name]["properties"]}
    assert "cluster" in values
    for schema in (schemas[name], without_not(schemas[name])):
        validate(values, schema, raise_on_error=True, preprocess=True)


def test_the_recipe_is_the_same_list_in_every_form(schemas):
    recipes = {
        "train": fields(schemas["train"])["train.recipe"],
        "compare": fields(schemas["compare"])["train.recipe"],
        "queue": fields(schemas["queue"])["job.recipe"],
    }
    for name, recipe in recipes.items():
        assert listed(recipe) == list(BUILTIN_RECIPES), name
        assert recipe["anyOf"] == recipes["train"]["anyOf"], name


def test_a_comparison_form_leaves_out_what_each_variant_fixes(schemas):
    """compare runs its own schedule and compression per variant (`TrainConfig.compared`)."""
    assert set(TRAIN_FIELDS) - set(COMPARE_FIELDS) == {"schedule", "compression"}
    form = fields(schemas["compare"])
    assert "train.schedule" not in form and "train.compression" not in form


def test_the_queue_form_submits_one_job(schemas):
    prop = schemas["queue"]["properties"]
    assert prop["job"]["$ref"].endswith("/QueueJob") and "jobs" not in prop
    job = prop["job"]["default"]
    validate({"job": job}, schemas["queue"], raise_on_error=True)
    ran = queue.validate_parameters({"job": job})
    assert ran["job"].name == job["name"] and ran["jobs"] == []
    assert queue.validate_parameters({})["job"] is None  # Python callers: only `jobs`


def test_every_field_carries_its_place_in_the_models_declaration(schemas):
    """Prefect's UIs sort a model's fields by `position` (one puts a field without it last,
    the other first): every field has it, in the order its model declares it."""
    for name, schema in schemas.items():
        for model, defn in schema.get("definitions", {}).items():
            props = defn.get("properties", {})
            if not props:
                continue  # an enum
            assert [p.get("position") for p in props.values()] == list(range(len(props))), (
                f"{name}: {model}"
            )


# The knobs that tune the machinery rather than the run: in YAML, JSON or a deployment run's
# parameters, not in the form.
MACHINERY = (
    "compression_candidates",
    "rebalance_every",
    "rebalance_threshold",
    "stall_timeout_s",
    "threads_per_rank",
    "faults",
)


@pytest.mark.parametrize("name", ["train", "compare", "profile-cluster"])
def test_the_machinerys_knobs_stay_out_of_the_form_and_are_still_taken(schemas, name):
    """And every other field the form leaves out, from the deployment's parameters."""
    schema, flow = schemas[name], FLOWS[name]
    form = fields(schema)
    assert not [p for p in form if p.startswith("train.") and p.split(".")[1] in MACHINERY]
    shown = schema["definitions"]["TrainConfig"]
    assert shown["additionalProperties"] is True
    assert all(k in shown["description"] for k in MACHINERY)
    given = {"train": {"stall_timeout_s": 60, "faults": {"group_restarts": 0}}}
    validate(given, schema, raise_on_error=True)  # the server's check
    ran = flow.validate_parameters(given)["train"]
    assert ran.stall_timeout_s == 60 and ran.faults.group_restarts == 0


def test_a_worker_is_a_few_fields_and_the_rest_stay_settable(schemas):
    form = block_fields()
    worker = [p for p in form if p.startswith("cluster.workers[].")]
    assert len(worker) <= WORKER_FIELDS, worker
    assert len(worker) * 2 <= len(WorkerSpec.model_fields)  # the demo's 4 workers: half
    defs = {**schemas["train"]["definitions"]}
    defs |= {"ClusterSpec": defs["ClusterBlock"], "DatasetSpec": defs["DatasetBlock"]}
    for model in (WorkerSpec, ClusterSpec, DatasetSpec):  # hidden, named, still accepted
        shown = defs[model.__name__]
        hidden = set(model.model_fields) - set(shown["properties"])
        assert hidden and shown["additionalProperties"] is True, model
        assert all(n in shown["description"] for n in hidden), model


YAML_CLUSTER = """
name: mixed
jitter: 0
pauses: 0
workers:
  - {name: a, instance_type: g5.xlarge, node: n1, precision: bf16, cpus: 1}
  - {name: b, instance_type: c5.xlarge, memory_cap_batch: 64, link_latency_ms: 0.5}
  - {name: c, preset: t4}
  - {name: d, speed: 2, knee_batch: 16, fixed_samples: 4, link_gbps: 10}
"""


def parameters_from_yaml_and_cli() -> dict[str, dict]:
    """Per flow, parameters as a deployment run sends them: from a cluster file with the
    fields the form leaves out, an EC2 type off the catalog's list, your own recipe, a
    compression argument off the list, None where Python took it."""
    cluster = yaml.safe_load(YAML_CLUSTER)
    train_cfg = {"recipe": "my_pkg.recipes:Tiny", "compression": "powersgd:8", "lr": None}
    dataset = {"source": "existing", "url": "s3://b/x", "shard_samples": 512, "s3_mbps": 100}
    common = {"cluster": cluster, "dataset": dataset, "train": train_cfg}
    return {
        "train": {**common, "variant": "mine"},
        "compare": common,
        "profile-cluster": {**common, "profiles_url": "s3://b/p", "record": False},
        "prepare-dataset": {"dataset": dataset, "overwrite": True},
        "queue": {"jobs": [{"name": "a", "arrive_after_s": 5}], "cluster": cluster, "switch_s": 0},
        "recommend": {
            "job": {"recipe": "bert-large", "max_local_batch": None},
            "candidates": [{"instance_type": "p3.2xlarge", "count": 2}],
            "objective": {"kind": "budget", "budget_usd": 100, "deadline_h": None},
        },
    }


def test_prefects_server_check_takes_the_forms_defaults_and_yaml_values(schemas):
    """With enforce_parameter_schema (Prefect's default), the server validates a run's
    parameters against the schema as `validate` does here."""
    given = parameters_from_yaml_and_cli()
    for name, schema in schemas.items():
        defaults = {k: p["default"] for k, p in schema["properties"].items() if "default" in p}
        validate(defaults, schema, raise_on_error=True)  # what the form starts from
        validate(given[name], schema, raise_on_error=True)
        ran = FLOWS[name].validate_parameters(given[name])  # and the flow takes them as before
        if "cluster" in ran:
            assert ran["cluster"].workers[3].knee_batch == 16 and ran["cluster"].jitter == 0
            assert ran["cluster"].workers[1].instance_type == "c5.xlarge"
    with pytest.raises(ValidationError, match="workers"):  # the schema still checks types
        validate({"cluster": {"workers": [{"name": "a", "speed": "fast"}]}}, schemas["train"], True)
    assert train.validate_parameters({"variant": None})["variant"] is None  # the CLI's default


def test_a_presets_speed_follows_the_preset_changed_in_a_form():
    """The queue form's cluster starts from the default's dump: a worker's preset changed
    there (t4 -> a100) runs at the new preset's speed, not the speed the dump carried; a speed
    the user typed stays."""
    from hetflow.config.cluster import preset_speed
    from hetflow.flows.job_queue import queue

    given = schema_of(queue)["properties"]["cluster"]["default"]
    first = given["workers"][0]
    assert first["preset"] == "t4" and "speed" not in first  # nothing derived pre-filled
    first["preset"] = "a100"
    ran = queue.validate_parameters({"cluster": given})["cluster"]
    assert ran.workers[0].speed == preset_speed("a100") != preset_speed("t4")
    first["speed"] = 2.5
    assert queue.validate_parameters({"cluster": given})["cluster"].workers[0].speed == 2.5


def test_a_presets_speed_follows_the_preset_in_a_file_and_the_cli(tmp_path):
    from hetflow.config import parse_speeds
    from hetflow.config.cluster import preset_speed

    path = tmp_path / "c.yaml"
    path.write_text("workers: [{name: a, preset: v100}, {name: b, preset: v100, speed: 1}]\n")
    a, b = ClusterSpec.from_file(path).workers
    assert (a.speed, b.speed) == (preset_speed("v100"), 1.0)
    read_back = ClusterSpec.model_validate(ClusterSpec.from_file(path).model_dump())
    assert [w.speed for w in read_back.workers] == [a.speed, 1.0]
    cli = ClusterSpec.from_speeds(parse_speeds("t4,a100"))
    assert [w.speed for w in cli.workers] == [preset_speed("t4"), preset_speed("a100")]
