"""Who won a comparison (`infra/report/verdict.py`): the sentence says what the figures imply,
in either direction, and a sentence that contradicts its figures is caught."""

from __future__ import annotations

import itertools
import math
import re

import pytest

from hetflow.infra.report.verdict import pays_after, verdict


def run(e2e: float, upfront: float, steps: int = 100, **more) -> dict:
    """A run's figures: `upfront` s of launch before `e2e - upfront` s of steps."""
    return {
        "end_to_end_s": e2e,
        "startup_s": upfront,
        "profiling_time_s": 0.0,
        "train_loop_s": e2e - upfront,
        "steps": steps,
        **more,
    }


def read(sentence: str) -> tuple[str, float, float, float]:
    """(faster|slower, the ratio, optimized's seconds, baseline's seconds) as the sentence says."""
    m = re.match(
        r"End to end, optimized .+ ([\d.]+)x (faster|slower) \(([\d.]+) s against ([\d.]+) s\)",
        sentence,
    )
    assert m, sentence
    return m[2], float(m[1]), float(m[3]), float(m[4])


def test_a_faster_optimized_run_is_called_faster_with_its_ratio_and_when_it_paid():
    said = verdict(run(40.0, 10.0), run(30.0, 12.0))
    assert read(said) == ("faster", 1.33, 30.0, 40.0)
    assert said.endswith("it paid for itself after 17 steps.")  # 2 s more / 0.12 s a step


def test_a_slower_optimized_run_is_called_slower_and_its_cost_named():
    said = verdict(run(30.0, 10.0), run(45.0, 25.0))
    assert read(said) == ("slower", 1.5, 45.0, 30.0)
    assert "cost more than its steps saved" in said and "paid for itself after" not in said


def test_steps_no_faster_are_said_so_even_where_the_run_spent_less_before_them():
    said = verdict(run(30.0, 10.0), run(31.0, 5.0))
    assert read(said)[0] == "slower" and "spent no more before its steps" in said
    # less spent before slower steps is not paying for itself
    assert said.endswith("its steps lost 6.0 s; its steps were no faster.")
    assert verdict(run(30.0, 10.0), run(35.0, 12.0)).endswith("its steps were no faster.")


def test_the_time_to_target_leads_where_both_reached_it_else_the_whole_run():
    base = run(40.0, 10.0, end_to_end_time_to_target_s=20.0)
    opt = run(30.0, 12.0, end_to_end_time_to_target_s=25.0)
    said = verdict(base, opt)  # the whole run was faster, the target slower: the target leads
    assert "reached the target" in said and read(said)[:2] == ("slower", 1.25)
    opt["end_to_end_time_to_target_s"] = None
    assert "finished the run" in verdict(base, opt) and read(verdict(base, opt))[0] == "faster"


def test_nothing_is_said_without_both_times():
    assert verdict(run(40.0, 10.0), {"startup_s": 3.0}) == ""


@pytest.mark.parametrize(
    "b, o, up_b, up_o",
    list(itertools.product([20.0, 33.0, 50.0], [19.0, 33.5, 60.0], [2.0, 8.0], [1.0, 9.0])),
)
def test_the_sentence_says_what_the_figures_imply_in_either_direction(b, o, up_b, up_o):
    base, opt = run(b, up_b), run(o, up_o)
    direction, ratio, t_o, t_b = read(verdict(base, opt))
    assert direction == ("faster" if o < b else "slower")
    assert ratio == pytest.approx(max(b, o) / min(b, o), abs=0.005)
    assert (t_o, t_b) == (o, b)
    n = pays_after(base, opt)
    per_step_saved = (b - up_b) / 100 - (o - up_o) / 100
    if per_step_saved < 0:
        assert n is None and verdict(base, opt).endswith("its steps were no faster.")
    elif up_o <= up_b:
        assert n == 0 and "paid for itself from its first step" in verdict(base, opt)
    elif per_step_saved > 0:
        assert n == math.ceil((up_o - up_b) / per_step_saved)
    else:
        assert n is None and verdict(base, opt).endswith("its steps were no faster.")
