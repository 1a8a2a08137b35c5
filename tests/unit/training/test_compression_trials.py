"""'auto' chooses its compression by measurement: the candidates it tries, the choice from a
table of measured steps (pure), and trials on real gloo ranks that leave the run as it would
have been with the chosen method set from the start."""

from __future__ import annotations

import pytest

from hetflow.config import (
    ClusterSpec,
    ConfigError,
    TrainConfig,
    WorkerSpec,
    check_job,
    validated,
)
from hetflow.records import MethodTrial
from hetflow.training.plan.compression import auto_candidates, choose_from_trials
from hetflow.training.plan.planner import make_plan

from tests.helpers.training.compression_trials import M
from tests.profiles import profile_of, rank_profile


def trial(method: str, step_s: float | None, error: str = "") -> MethodTrial:
    return MethodTrial(method=M(method), step_s=step_s, bytes_per_step=1.0, error=error)


# -- the choice (pure) ------------------------------------------------------------------------


def test_the_shortest_measured_step_is_kept_and_the_reason_gives_the_table():
    table = [
        trial("none", 0.40),
        trial("fp16", 0.33),
        trial("bf16", 0.35),
        trial("powersgd:4", 0.31),
    ]
    method, reason = choose_from_trials(table)
    assert method == M("powersgd:4")
    assert "powersgd:4 310.0 ms" in reason and "none 400.0 ms" in reason and "\n" not in reason


def test_of_equal_steps_the_earlier_candidate_is_kept_whatever_the_order_of_the_others():
    assert choose_from_trials([trial("none", 0.2), trial("fp16", 0.2)])[0] == M("none")
    assert choose_from_trials([trial("fp16", 0.3), trial("bf16", 0.2), trial("none", 0.2)])[0] == M(
        "bf16"
    )


def test_a_lossy_method_does_not_win_on_the_trials_noise():
    """'none' is kept unless another's step is shorter by more than two standard deviations
    of the noisier trial (and at least 2%): the demo chose none, fp16 or bf16 across runs."""
    none = MethodTrial(method=M("none"), step_s=0.400, spread_s=0.020)
    within = MethodTrial(method=M("fp16"), step_s=0.370, spread_s=0.010)  # 30 ms < 2 x 20 ms
    method, reason = choose_from_trials([none, within])
    assert method == M("none") and "no other was shorter by more than the trials' noise" in reason
    beyond = MethodTrial(method=M("bf16"), step_s=0.350, spread_s=0.010)  # 50 ms > 40 ms
    assert choose_from_trials([none, within, beyond])[0] == M("bf16")
    quiet = MethodTrial(method=M("fp16"), step_s=0.395)  # no spread: 1.25% < the 2% floor
    assert choose_from_trials([trial("none", 0.400), quiet])[0] == M("none")


def test_a_failed_trial_is_never_kept_even_when_it_looks_fastest():
    table = [
        trial("none", 0.5),
        trial("powersgd:4", None, "RuntimeError: boom"),
        trial("fp16", float("inf")),
        trial("bf16", 0.45),
    ]
    method, reason = choose_from_trials(table)
    assert method == M("bf16") and "powersgd:4 failed" in reason and "fp16 failed" in reason


def test_when_every_trial_failed_the_error_names_the_field_and_each_failure():
    with pytest.raises(ValueError) as e:
        choose_from_trials([trial("none", None, "RuntimeError: a"), trial("fp16", None)])
    msg = str(e.value)
    assert msg.startswith("train.compression_candidates:") and "none: RuntimeError: a" in msg
    assert "\n" not in msg


# -- the candidates ---------------------------------------------------------------------------


def _nodes(*nodes: str) -> ClusterSpec:
    return ClusterSpec(workers=[WorkerSpec(name=f"w{i}", node=n) for i, n in enumerate(nodes)])


def test_local_sgd_is_a_candidate_only_when_the_config_allows_it():
    one_node, two_nodes = _nodes("a", "a"), _nodes("a", "a", "b", "b")
    plain = TrainConfig(compression="auto")
    assert [str(m) for m in auto_candidates(plain, two_nodes)] == [
        "none",
        "fp16",
        "bf16",
        "powersgd:4",
    ]
    allowed = TrainConfig(compression="auto", allow_local_sgd=True)
    assert [str(m) for m in auto_candidates(allowed, one_node)][-1] == "localsgd:4"
    assert [str(m) for m in auto_candidates(allowed, two_nodes)][-2:] == [
        "localsgd:4",
        "hierarchical:4",
    ]
    assert auto_candidates(allowed, _nodes("a")) == []  # one worker: nothing to try


@pytest.mark.parametrize(
    "knobs, expected",
    [
        ({"compression_candidates": ["none", "gzip"]}, "unknown method 'gzip'"),
        ({"compression_candidates": ["localsgd:2"]}, "set allow_local_sgd"),
        ({"compression_candidates": ["none", "none"]}, "appears twice"),
        ({"compression_candidates": []}, "at least one"),
        ({"compression_candidates": ["auto"]}, "unknown method 'auto'"),
    ],
)
def test_bad_candidates_are_refused_in_one_line_naming_the_field(knobs, expected):
    with pytest.raises(ConfigError) as e:
        validated(TrainConfig, knobs, "train")
    msg = str(e.value)
    assert msg.startswith("train.compression_candidates:") and expected in msg, msg
    assert "\n" not in msg


def test_allowed_local_sgd_refuses_a_skip_on_nonfinite_and_fp16_naming_the_field():
    cluster = ClusterSpec.from_speeds([1, 1])
    with pytest.raises(ConfigError, match=r"^train\.nonfinite: .*train\.allow_local_sgd"):
        check_job(cluster, TrainConfig(compression="auto", allow_local_sgd=True, nonfinite="skip"))
    with pytest.raises(ConfigError, match=r"^train\.precision: fp16 .*allow_local_sgd"):
        check_job(cluster, TrainConfig(compression="auto", allow_local_sgd=True, precision="fp16"))
    check_job(cluster, TrainConfig(compression="auto", nonfinite="skip", precision="fp16"))


def test_a_comparison_refuses_what_its_optimized_variant_may_not_run_before_anything_starts():
    from hetflow.flows.compare import compare

    base = TrainConfig(allow_local_sgd=True, nonfinite="skip")  # fine for the baseline's none
    check_job(ClusterSpec.from_speeds([1, 1]), base)
    with pytest.raises(ConfigError, match=r"^train\.nonfinite: .*train\.allow_local_sgd"):
        compare.fn(cluster=ClusterSpec.from_speeds([1, 1]), train=base)


def test_the_cli_lets_the_optimized_variant_try_local_sgd_only_when_asked():
    from hetflow.cli import build_parser
    from hetflow.cli.job import job_of

    def optimized(*flags: str) -> TrainConfig:
        args = build_parser().parse_args(["train", "--speeds", "1,1", *flags])
        return job_of(args, variant="optimized").train

    assert not optimized().allow_local_sgd
    asked = optimized("--allow-local-sgd")
    assert asked.allow_local_sgd and asked.compression == "auto"
    assert "localsgd:4" in [str(m) for m in auto_candidates(asked, ClusterSpec.from_speeds([1, 1]))]


def test_the_plan_of_auto_lists_the_candidates_and_falls_back_to_the_profile_on_one_worker():
    train = TrainConfig(compression="auto", global_batch=64)
    two = make_plan(
        profile_of([rank_profile(0, 1000.0), rank_profile(1, 1000.0)]), _nodes("a", "a"), train
    )
    assert two.compression == M("none") and "try" in two.compression_reason
    assert [str(m) for m in two.compression_candidates] == list(train.compression_candidates)
    one = make_plan(profile_of([rank_profile(0, 1000.0)]), _nodes("a"), train)
    assert one.compression_candidates == [] and "from the profile" in one.compression_reason
    fixed = make_plan(
        profile_of([rank_profile(0, 1000.0), rank_profile(1, 1000.0)]),
        _nodes("a", "a"),
        train.model_copy(update={"compression": "fp16"}),
    )
    assert fixed.compression == M("fp16") and fixed.compression_candidates == []
