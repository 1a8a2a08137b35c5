"""What every configuration model shares: the one-line error, the base model, reading a
config file or a `--speeds` list, and the built-in recipes' names (re-exported by
`hetflow.config`, where the models live)."""

from __future__ import annotations

import difflib
import json
import math
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError


class ConfigError(ValueError):
    """A bad configuration value: the message is one line and names the field."""


def suggestion(word: str, candidates) -> str:
    """`"; did you mean X?"` for the candidate closest to `word`, or "" if none is close."""
    close = difflib.get_close_matches(word, [str(c) for c in candidates], n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


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


class ConfigModel(BaseModel):
    """The base of every config model: an unknown field is an error, and so is an assignment
    that breaks a field's rule."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


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
RECIPE_PATTERN = r"^[\w.-]+$|^[\w.]+:\w+$"
