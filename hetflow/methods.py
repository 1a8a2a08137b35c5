"""The gradient-communication method as a parsed value (`CompressionMethod`), its names and its
text syntax: what the config, the plan and the comm layer name a method by.

    >>> CompressionMethod.parse("powersgd:4")
    CompressionMethod(name='powersgd', rank=4, ratio=None, period=None)
    >>> str(CompressionMethod.parse("topk:0.01"))
    'topk:0.01'
"""

from __future__ import annotations

import math
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict

METHOD_NAMES = ("none", "fp16", "bf16", "powersgd", "topk", "localsgd", "hierarchical")
MethodName = Literal["none", "fp16", "bf16", "powersgd", "topk", "localsgd", "hierarchical"]
# Methods that do not all-reduce the gradient every step (the model is averaged every H steps).
LOCAL_SGD = ("localsgd", "hierarchical")
METHOD_SYNTAX = "none, fp16, bf16, powersgd:RANK, topk:RATIO, localsgd:H or hierarchical:H"
_METHOD = re.compile(r"^(?P<name>[a-z0-9]+)(?::(?P<arg>.+))?$")
_ARGUMENT = {"powersgd": "rank", "topk": "ratio", "localsgd": "period", "hierarchical": "period"}


class _Method(BaseModel):
    # as the records: NaN and inf travel as JSON's NaN/Infinity
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")


class CompressionMethod(_Method):
    """A gradient-communication method, parsed once from its text form (`powersgd:4`).

    `rank` is PowerSGD's matrix rank, `ratio` top-k's share of entries sent, `period` the steps
    between model averages of local SGD and hierarchical averaging; the others are None.
    'auto' is not a method: the planner resolves it into one.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")

    name: MethodName = "none"
    rank: int | None = None
    ratio: float | None = None
    period: int | None = None

    @classmethod
    def parse(cls, text: str) -> CompressionMethod:
        """`"topk:0.01"` -> CompressionMethod(name='topk', ratio=0.01); ValueError naming
        what is wrong otherwise (callers prefix the field)."""
        m = _METHOD.match(text.strip())
        name, arg = (m["name"], m["arg"]) if m else (text, None)
        if name not in METHOD_NAMES:
            raise ValueError(f"unknown method {text!r}; use {METHOD_SYNTAX}")
        field = _ARGUMENT.get(name)
        if field is None:
            if arg is not None:
                raise ValueError(f"{name} takes no argument (got {text!r})")
            return cls(name=name)
        if arg is None:
            raise ValueError(f"{name} needs {name}:{field.upper()} (got {text!r})")
        if field == "ratio":
            try:
                ratio = float(arg)
            except ValueError:
                ratio = math.nan
            if not 0 < ratio <= 1:
                raise ValueError(f"topk ratio must be a number in (0, 1] (got {arg!r})")
            return cls(name=name, ratio=ratio)
        if not re.fullmatch(r"-?\d+", arg) or int(arg) < 1:
            raise ValueError(f"{name} {field} must be a whole number >= 1 (got {arg!r})")
        return cls(name=name, **{field: int(arg)})

    def __str__(self) -> str:
        arg = f"{self.ratio:g}" if self.ratio is not None else self.rank or self.period
        return self.name if arg is None else f"{self.name}:{arg}"
