"""The candidates a search prices (`search.search`): each instance type of the rental market
(the offline catalog and its prices, read by the caller: `hetflow.infra.market`) with its
step-time curve, measured (the profile history, `History`) or published, and its spot figures.
Bad input is one line (a RecommendError), the same in `hetflow recommend` and the flow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hetflow.config import MODEL_ALIASES, suggestion
from hetflow.forecast.rent.measured import MeasuredCurve, curve_of
from hetflow.forecast.rent.search import (
    PRESET_OF_GPU,
    PRESETS,
    Candidate,
    Job,
    RecommendError,
    curve_for,
)
from hetflow.forecast.rent.spot_table import spot_terms
from hetflow.forecast.simulate.memory import device_limit
from hetflow.forecast.simulate.models import MODELS, NAMES, ModelSpec
from hetflow.history import TypeEntry, source_of


@dataclass(frozen=True)
class History:
    """What the profile history under `url` holds for the candidates: a measured curve per
    instance type with a fresh entry, and a line per type whose newest entry is too old."""

    url: str
    max_age_h: float
    curves: dict[str, MeasuredCurve]
    stale: dict[str, str]  # instance type -> 'its newest entry is N h old (> M h)'


def measured_history(url: str, max_age_h: float, newest: dict[str, TypeEntry]) -> History:
    """The `History` of the newest real entry of each instance type under `url`
    (`hetflow.history.store.newest_real`): its curve (`measured.curve_of`) where it is at most
    `max_age_h` hours old, else a line saying how old."""
    curves, stale = {}, {}
    for name, entry in newest.items():
        if entry.age_h() > max_age_h:
            stale[name] = f"its newest entry is {entry.age_h():.1f} h old (> {max_age_h:g} h)"
        elif (curve := curve_of(entry.rank, source_of(entry))) is not None:
            curves[name] = curve
    return History(url, max_age_h, curves, stale)


def no_history(name: str, job: Job, history: History | None) -> str:
    """Why `name` has no measured curve either, and how to give it one."""
    how = (
        f"profile one {name} for {job.model.name} (a cluster file of one worker with "
        f"instance_type {name}, emulate: false, run by `hetflow profile --cluster FILE` on it)"
    )
    if history is None:
        return f"or {how} and pass its history to --profiles"
    if name in history.stale:
        return f"its profile history under {history.url} is stale ({history.stale[name]})"
    return f"no profile history of it for {job.model.name} under {history.url}: {how}"


def model_of(recipe: str) -> ModelSpec:
    """The figures of `recipe` (the simulator's models; `resnet`, training's name of a ResNet,
    means `resnet50`: MODEL_ALIASES), or one line naming the choices."""
    recipe = MODEL_ALIASES.get(recipe, recipe)
    if recipe not in MODELS:
        raise RecommendError(
            f"--recipe: {recipe!r} is not a model recommend knows ({', '.join(NAMES)})"
            f"{suggestion(recipe, NAMES)}"
        )
    return MODELS[recipe]


def candidates(
    mix: Sequence[tuple[str, int]],
    job: Job,
    market,
    max_local_batch: int | None = None,
    spot=None,
    history: History | None = None,
    precision: str = "mixed",
) -> list[Candidate]:
    """Candidates of `mix`, (name, count) pairs, from `market` (`hetflow.infra.market`'s: the
    offline catalog's types and their On-Demand prices) with step curves up to the global batch
    or `max_local_batch`: a type's measured one where `history` has it (`rent.measured`),
    else its GPU's published one, up to the memory cap of a job in `precision`
    (`simulate.memory`); spot figures from the SpotTable `spot` where given. One line
    naming a type the catalog lacks, one without a price, one without either curve (and what
    would give it one), one without spot figures."""
    names = [name for name, _ in mix]
    if len(set(names)) != len(names):
        raise RecommendError(f"--candidates: an instance type appears twice ({names})")
    types, prices = market.types, market.prices
    max_batch = min(job.global_batch, max_local_batch or job.global_batch)
    out = []
    for name, count in mix:
        if name not in types:
            families = ", ".join(sorted({k.split(".")[0] for k in types}))
            raise RecommendError(
                f"--candidates: {name} is not in the offline catalog (infra/instance_types.json: "
                f"{families}){suggestion(name, types)}"
            )
        info = types[name]
        measured = history.curves.get(name) if history is not None else None
        preset = PRESET_OF_GPU.get(info.gpu_name or "")
        memory = _memory(name, info, preset, job, measured, precision)
        top = max_batch if memory.cap is None else min(max_batch, memory.cap)
        if measured is not None:
            steps = measured.steps(top)
        else:
            try:
                preset, steps = curve_for(name, info.gpu_name, job.model, top)
            except RecommendError as e:
                raise RecommendError(f"{e}; {no_history(name, job, history)}") from None
        if name not in prices.prices:
            raise RecommendError(
                f"--candidates: {name} has no on-demand price in infra/prices.json "
                f"({prices.source}, as of {prices.as_of}); add it there"
            )
        usd = prices.prices[name]
        terms = (None, 0.0) if spot is None else spot_terms(name, usd, spot)
        args = (name, count, usd, info.devices, info.device, preset, info.network_gbps, steps)
        out.append(Candidate(*args, *terms, measured=measured and measured.source, memory=memory))
    return out


def _memory(name: str, info, preset: str | None, job: Job, measured, precision: str):
    """The largest local batch of one device of `name` (`simulate.memory.device_limit`): the
    measured cap, else the model's memory against the device's (the catalog's, else its
    preset's); one line when not even the model's state fits."""
    device_mib = info.gpu_memory_mib or (PRESETS[preset].memory_gib * 1024 if preset else 0)
    cap = measured.cap if measured is not None else None
    limit = device_limit(job.model, info.gpu_name, device_mib, cap, precision)
    if limit.cap == 0:
        raise RecommendError(
            f"--candidates: {name}: not one sample of {job.model.name} fits its memory "
            f"({limit.why}); rent a larger GPU"
        )
    return limit
