"""What every configuration model shares: the one-line error, the base model and how its
JSON schema reads as a Prefect form, reading a config file or a `--speeds` list, and the
built-in recipes' names (re-exported by `hetflow.config`, where the models live)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from hetflow.errors import ConfigError
from hetflow.errors import suggestion as suggestion  # re-exported: hetflow.config names it


def describe_validation_error(err: ValidationError, prefix: str = "") -> str:
    """One line per problem, `field.path: message (got value)`, the first problem first."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if p != "__root__")
        where = ".".join(p for p in (prefix, loc) if p)
        msg = e["msg"].removeprefix("Value error, ")
        got = e.get("input")
        shown = "" if isinstance(got, (dict, list)) or got is None else f" (got {got!r})"
        lines.append(f"{where or 'config'}: {msg}{shown}")
    return lines[0] if len(lines) == 1 else "; ".join(lines)


ALSO_SETTABLE = " Also settable in YAML or JSON: "


def form_schema(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """A config model's JSON schema as the Prefect form reads it (changes the schema only;
    validation is the model's own, the same from YAML, the CLI or a flow run).

    - A field whose empty value means "the natural default" (`X | None = None`: the recipe's
      learning rate, no instance type) is shown as X alone, with no `default`: left empty, the
      form sends nothing and the model fills in None. Prefect's server accepts null for such
      a field too (it allows null for a property that has no default).
    - A field that takes None besides another default (`target_accuracy`) keeps the choice,
      its None branch titled "none" rather than a bare null.
    - An enum field that may be None is left out of dumps when it is (`exclude_if`): a
      flow's default parameter is the model's dump, the form starts from it, and Prefect's
      server refuses a null that is not one of the enum's values.
    - Fields marked `SkipJsonSchema` are left out of the form; they stay valid in YAML, JSON
      and a deployment run's parameters (`additionalProperties` is true, the model still
      refuses an unknown field), and the model's description names them.
    - Every field carries its `position`, its place in the model's declaration: Prefect's UIs
      sort a model's fields by it (the older one puts a field without one last, the newer one
      first), so the form shows them in the order the model declares them.
    """
    props = schema.get("properties", {})
    for position, prop in enumerate(props.values()):
        prop["position"] = position
    for prop in props.values():
        branches = prop.get("anyOf", [])
        kept = [b for b in branches if b.get("type") != "null"]
        if not branches or len(kept) == len(branches):
            continue
        if "default" in prop and prop["default"] is None:
            del prop["anyOf"], prop["default"]
            prop.update(kept[0] if len(kept) == 1 else {"anyOf": kept})
        else:
            prop["anyOf"] = [
                b if b.get("type") != "null" else {**b, "title": "none"} for b in branches
            ]
    hidden = [name for name in model.model_fields if name not in props]
    if hidden:
        schema["additionalProperties"] = True
        said = (schema.get("description") or "").rstrip()
        schema["description"] = f"{said}{ALSO_SETTABLE}{', '.join(hidden)}."


def offer_choices(prop: dict[str, Any], values: Iterable[str], listed: str, other: str | None):
    """`prop`, a string field's schema, offering `values` in a list: an enum, or with `other`
    a choice between the list (titled `listed`) and a free string (titled `other`, with the
    field's own pattern). Idempotent: a field that already offers a list is left as it is."""
    if "anyOf" in prop or "enum" in prop:
        return prop
    rules = {k: prop[k] for k in ("pattern", "minLength", "maxLength") if k in prop}
    rest = {k: v for k, v in prop.items() if k not in rules}  # its "type" stays: Prefect's
    # server then accepts null where the field has no default (a worker's empty instance type)
    choices = {"type": "string", "enum": list(values)}
    if other is None:
        return {**rest, **choices}
    return {
        **rest,
        "anyOf": [{**choices, "title": listed}, {"type": "string", **rules, "title": other}],
    }


class FormChoices:
    """`Annotated[SomeConfigModel, FormChoices("workers.instance_type", names, ...)]`: in the
    JSON schema of a flow parameter of that type, the field at that dotted path (through
    nested models and lists of them) offers `names` (`offer_choices`). For choices the config
    layer cannot know (the EC2 catalog lives in `hetflow.infra`); validation is unchanged.
    Pydantic sets a nested field's schema only from its own model: this walks the parameter's
    schema through `handler.resolve_ref_schema`, pydantic's hook for it."""

    def __init__(self, path: str, values: Iterable[str], listed: str = "list", other=None):
        self.path, self.values, self.listed, self.other = path, tuple(values), listed, other

    def __get_pydantic_json_schema__(self, core_schema, handler):
        json_schema = handler(core_schema)
        node = handler.resolve_ref_schema(json_schema)
        *parents, leaf = self.path.split(".")
        for name in parents:
            node = node["properties"][name]
            node = handler.resolve_ref_schema(node.get("items", node))
        props = node["properties"]
        props[leaf] = offer_choices(props[leaf], self.values, self.listed, self.other)
        return json_schema


class FormFields:
    """`Annotated[SomeConfigModel, FormFields("recipe", "steps", ...)]`: the form of a flow
    parameter of that type shows only these fields, in this order (what a person chooses for
    one run); the model's other fields stay valid in the deployment's parameters
    (prefect.yaml), YAML or JSON (`additionalProperties`; the model still refuses an unknown
    field), and the form's description names them. Validation is unchanged."""

    def __init__(self, *names: str):
        self.names = names

    def __get_pydantic_json_schema__(self, core_schema, handler):
        json_schema = handler(core_schema)
        node = handler.resolve_ref_schema(json_schema)
        props = node["properties"]
        node["properties"] = {n: {**props[n], "position": i} for i, n in enumerate(self.names)}
        node["required"] = [n for n in node.get("required", []) if n in self.names]
        node["additionalProperties"] = True
        said, _, skipped = (node.get("description") or "").partition(ALSO_SETTABLE)
        hidden = [n for n in props if n not in self.names]
        hidden += [n for n in skipped.rstrip(".").split(", ") if n and n not in hidden]
        node["description"] = (
            f"{said} Also settable in the deployment's parameters (prefect.yaml), YAML or "
            f"JSON: {', '.join(hidden)}."
        )
        return json_schema


class ConfigModel(BaseModel):
    """The base of every config model: an unknown field is an error, and so is an assignment
    that breaks a field's rule; its JSON schema is a Prefect form (`form_schema`)."""

    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, json_schema_extra=form_schema
    )


def finite_positive(name: str, v: float | None) -> float | None:
    """`v` if it is None or a finite number > 0; else a ValueError naming `name`."""
    if v is not None and (not math.isfinite(v) or v <= 0):
        raise ValueError(f"{name} must be a finite number > 0")
    return v


def parse_speeds(text: str) -> list[float | str]:
    """`"1,1,2,4"` -> [1.0, 1.0, 2.0, 4.0]; a device preset's name stays a name (`"t4,2"` ->
    ["t4", 2.0]); a one-line error naming `--speeds`."""
    from hetflow.emulation.presets import PRESETS

    speeds: list[float | str] = []
    for i, s in enumerate(p.strip() for p in text.split(",") if p.strip()):
        if s.lower() in PRESETS:
            speeds.append(s.lower())
            continue
        try:
            speed = float(s)
        except ValueError:
            raise ConfigError(
                f"--speeds: worker {i}: expected a number or a preset ({', '.join(PRESETS)}), "
                f"got {s!r}"
            ) from None
        if not math.isfinite(speed) or speed <= 0:
            raise ConfigError(
                f"--speeds: worker {i} speed must be a finite number > 0 (got {speed})"
            )
        speeds.append(speed)
    if not speeds:
        raise ConfigError("--speeds: at least one speed is needed")
    return speeds


def load_mapping(path: str | Path) -> dict:
    """Read a YAML or JSON file that must hold a mapping; one-line error otherwise."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"{p}: cannot read ({e.strerror})") from None
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        first = str(e).splitlines()[0]
        raise ConfigError(f"{p}: not valid YAML/JSON ({first})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def validated(model: type[BaseModel], data: dict, prefix: str) -> BaseModel:
    """model.model_validate(data), with the error turned into a one-line ConfigError."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(describe_validation_error(e, prefix)) from None


# The built-in recipes (hetflow.training.recipes) by name: where each lives, and what it is.
BUILTIN_RECIPES = {
    "digits-mlp": "hetflow.training.recipes.digits:DigitsMLP",
    "digits-cnn": "hetflow.training.recipes.digits:DigitsCNN",
    "digits-wide-mlp": "hetflow.training.recipes.digits:DigitsWideMLP",
    "gpt": "hetflow.training.recipes.gpt:GPT",
    "resnet": "hetflow.training.recipes.resnet:ResNet",
}
RECIPE_NOTES = {
    "digits-cnn": "small conv net on tabular digits, 151k params",
    "digits-mlp": "85k params",
    "digits-wide-mlp": "4.3M params, for communication studies",
    "gpt": "byte-level transformer language model on token shards, 3.2M params",
    "resnet": "residual image classifier on uint8 image shards",
}
# One network, two names: training's recipe `resnet` is a CIFAR ResNet-14, recommend's model
# `resnet50` is ResNet-50's published figures. Each command takes the other's name for the
# network it has, and says so in one line (`alias_note`); docs/recipes.md, "Names across
# commands".
RECIPE_ALIASES = {"resnet50": "resnet"}  # demo, train, queue: the name -> the recipe trained
MODEL_ALIASES = {"resnet": "resnet50"}  # recommend, simulate: the name -> the figures used
ALIAS_NOTES = {
    "resnet50": "training has no ResNet-50: this trains `resnet`, a CIFAR ResNet-14 (0.17M "
    "parameters); `resnet50` is recommend's name for ResNet-50's published figures",
    "resnet": "recommend models ResNet-50's published figures (`resnet50`); `resnet` trains "
    "a CIFAR ResNet-14 in demo, train and queue",
}


def alias_note(flag: str, name: str, aliases: dict[str, str]) -> str | None:
    """The one line saying what `name`, the other command's name of a network, means here
    (`aliases` is RECIPE_ALIASES or MODEL_ALIASES); None for a name of this command's own.

    >>> alias_note("--recipe", "resnet", MODEL_ALIASES).split(":")[0]
    '--recipe resnet'
    >>> alias_note("--recipe", "resnet", RECIPE_ALIASES) is None
    True
    """
    if name not in aliases:
        return None
    return f"{flag} {name}: {ALIAS_NOTES[name]}"


RECIPE_PATTERN = r"^[\w.-]+$|^[\w.]+:\w+$"
# One line in a form; docs/recipes.md says what each built-in is (`RECIPE_NOTES`).
RECIPE_DESCRIPTION = (
    "A built-in model and loss (docs/recipes.md), or your own Recipe class as "
    "'package.module:Name'."
)


def one_of(v: str | None, names) -> str | None:
    """`v` where it is None or one of `names`, else a ValueError listing them (a named preset:
    a device, a link, a noise level).

    >>> one_of("t4", ["t4", "v100"]), one_of(None, ["t4"])
    ('t4', None)
    """
    if v is not None and v not in names:
        raise ValueError(f"{v!r} is not one of {', '.join(names)}")
    return v
