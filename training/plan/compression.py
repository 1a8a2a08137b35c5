"""'auto': the methods it tries, the one it keeps from their measured steps, and the profile's
rule where nothing can be tried (pure)."""

from __future__ import annotations

import logging
import math

from hetflow.config import ClusterSpec, TrainConfig
from hetflow.records import LOCAL_SGD, CompressionMethod, MethodTrial

log = logging.getLogger(__name__)

# The communication share of a step from which the profile's rule compresses (used only where
# 'auto' cannot try methods: one worker), tuned with `hetflow bench comm`.
COMPRESS_ABOVE = 0.40
STRONG_METHOD = CompressionMethod(name="powersgd", rank=4)
# What `allow_local_sgd` adds to 'auto''s candidates: local SGD, and hierarchical averaging
# where the workers span several nodes (on one node it would keep every byte off the link).
LOCAL_SGD_PERIOD = 4
# A candidate replaces the first (least lossy) one only where its step is shorter by more than
# NOISE_SIGMAS standard deviations of the trials' timed steps and by at least MIN_GAIN: a
# lossy method must not win on noise.
NOISE_SIGMAS = 2.0
MIN_GAIN = 0.02
# Each candidate's trial (`training.loop.trials`): a dense warm-up (DDP rebuilds its buckets
# after the first step; PowerSGD and top-k need 2 dense steps before they compress), the first
# compressing step (it pays one-off costs), then the timed steps, a multiple of local SGD's
# period so that its averaging steps count at the rate they run.
TRIAL_WARMUP_STEPS = 2
TRIAL_UNTIMED_STEPS = TRIAL_WARMUP_STEPS + 1
TRIAL_TIMED_STEPS = 4
TRIAL_STEPS = TRIAL_UNTIMED_STEPS + TRIAL_TIMED_STEPS


def auto_candidates(train: TrainConfig, cluster: ClusterSpec) -> list[CompressionMethod]:
    """What 'auto' tries on `cluster`, in order: `train.compression_candidates`, then, with
    `train.allow_local_sgd` and none of them listed, localsgd:4 and (workers on more than one
    node) hierarchical:4. Empty where nothing can be tried: a single worker."""
    if cluster.world_size < 2:
        return []
    methods = [CompressionMethod.parse(m) for m in train.compression_candidates]
    if train.allow_local_sgd and not any(m.name in LOCAL_SGD for m in methods):
        methods.append(CompressionMethod(name="localsgd", period=LOCAL_SGD_PERIOD))
        if len({w.node for w in cluster.workers}) > 1:
            methods.append(CompressionMethod(name="hierarchical", period=LOCAL_SGD_PERIOD))
    return methods


def too_short_for_trials(train: TrainConfig, candidates: list[CompressionMethod]) -> str:
    """Why 'auto' keeps an uncompressed first candidate without trying any (pure), or '': a
    run of no more steps than the trials would take cannot win them back, since no method
    saves more than a whole step.

    >>> m = [CompressionMethod.parse(x) for x in ("none", "fp16", "bf16", "powersgd:4")]
    >>> too_short_for_trials(TrainConfig(steps=20), m)[:40]
    "'auto' kept none untried: the run's 20 s"
    >>> too_short_for_trials(TrainConfig(steps=200), m)
    ''
    """
    if not candidates or candidates[0].name != "none" or len(candidates) < 2:
        return ""
    cost = len(candidates) * TRIAL_STEPS
    if train.steps > cost:
        return ""
    return (
        f"'auto' kept none untried: the run's {train.steps} steps are no more than the {cost} "
        f"that trying its {len(candidates)} candidates takes, and no method saves a whole step"
    )


def _measured(t: MethodTrial) -> bool:
    return t.step_s is not None and math.isfinite(t.step_s)


def _said(t: MethodTrial) -> str:
    return f"{t.method} {t.step_s * 1e3:.1f} ms" if _measured(t) else f"{t.method} failed"


def beats(t: MethodTrial, first: MethodTrial) -> bool:
    """Whether `t`'s step is shorter than `first`'s by more than the trials' noise: by
    NOISE_SIGMAS standard deviations of the noisier of the two, and at least MIN_GAIN of
    `first`'s step (pure)."""
    margin = max(NOISE_SIGMAS * max(t.spread_s, first.spread_s), MIN_GAIN * first.step_s)
    return first.step_s - t.step_s > margin


def choose_from_trials(trials: list[MethodTrial]) -> tuple[CompressionMethod, str]:
    """The method kept, and why (pure: the same on every rank for the same table). The first
    measured trial (the candidates' order: least lossy first) is kept unless another's step is
    shorter by more than the trials' noise (`beats`); of those that are, the shortest (the
    earlier of equal ones). A trial that failed (`step_s` None or not finite) is never kept.
    ValueError naming `train.compression_candidates` when no trial measured a step."""
    measured = [(t.step_s, i) for i, t in enumerate(trials) if _measured(t)]
    if not measured:
        failed = "; ".join(f"{t.method}: {t.error or 'no step measured'}" for t in trials)
        raise ValueError(f"train.compression_candidates: every trial failed ({failed})")
    first = trials[measured[0][1]]
    better = [(s, i) for s, i in measured if beats(trials[i], first)]
    _, best = min(better) if better else measured[0]
    others = ", ".join(_said(t) for i, t in enumerate(trials) if i != best)
    chosen = trials[best].method
    if better:
        reason = f"shortest measured step of the {len(trials)} tried: {_said(trials[best])}"
    else:
        reason = (
            f"the first candidate, {_said(first)}: no other was shorter by more than the "
            "trials' noise"
        )
    reason += f" (against {others})" if others else ""
    log.info("compression 'auto' -> %s: %s", chosen, reason)
    return chosen, reason


def choose_compression(
    comm_share: float, threshold: float = COMPRESS_ABOVE
) -> tuple[CompressionMethod, str]:
    """The profile's rule, for 'auto' where no method can be tried (`auto_candidates` is
    empty): compress only when communication is a large share of the step; say why (the
    reason is also logged).

    `comm_share` is the profiled all-reduce time of one gradient over (compute + all-reduce).
    Below `threshold` nothing is compressed: the saving is at most that share and compression
    costs compute and some accuracy. From there on PowerSGD rank 4, which sends far fewer bytes
    than all-reduce at an accuracy close to it.
    """
    if comm_share < threshold:
        method = CompressionMethod(name="none")
        reason = (
            f"measured communication is {comm_share:.0%} of the step (< {threshold:.0%}): "
            "compression would cost compute and accuracy for little time"
        )
    else:
        method = STRONG_METHOD
        reason = (
            f"communication is {comm_share:.0%} of the step (>= {threshold:.0%}): "
            "PowerSGD rank 4 cuts the bytes by >8x"
        )
    log.info("compression 'auto' -> %s: %s", method, reason)
    return method, reason
