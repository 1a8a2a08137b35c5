"""`hetflow recommend`: the mix search under its model (pure), bad input through the real CLI,
and the cluster file it writes read back by ClusterSpec."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from hetflow.cli import main
from hetflow.config import ClusterSpec
from hetflow.forecast.rent.rental import candidates
from hetflow.forecast.rent.search import (
    Candidate,
    Evaluator,
    Job,
    Objective,
    RecommendError,
    local_batches,
    search,
)
from hetflow.forecast.rent.table import mixing_line
from hetflow.forecast.simulate.clusters import parse_mix
from hetflow.forecast.simulate.models import MODELS
from hetflow.infra.market import load_market

RESNET = MODELS["resnet50"]
MIX = "g4dn.xlarge:8,p3.2xlarge:8,p4d.24xlarge:4"


def catalog_cands(text: str, job: Job) -> list[Candidate]:
    return candidates(parse_mix(text), job, load_market())


def affine(name, available, usd, latency_s, per_sample_s, batch, devices=1, nic=1e6):
    """A made-up type whose step is latency + per_sample x b (a fast network by default)."""
    steps = tuple(latency_s + per_sample_s * b for b in range(1, batch + 1))
    return Candidate(name, available, usd, devices, "A100", "a100", nic, steps)


def singles(cands, job):
    """Every count of every type alone, as the model predicts it."""
    ev = Evaluator(cands, job)
    for i, c in enumerate(cands):
        for n in range(1, c.available + 1):
            p = ev(tuple(n if j == i else 0 for j in range(len(cands))))
            if p is not None:
                yield p


# -- the search, pure ---------------------------------------------------------------------------


def test_with_plenty_of_a100s_the_cheaper_types_are_not_worth_adding():
    job = Job(RESNET, global_batch=1024, steps=10_000)
    cands = catalog_cands(MIX, job)
    rec = search(cands, job, Objective("deadline", deadline_h=0.15))
    assert rec.best.label(cands) == "p4d.24xlarge x2"
    assert not rec.mixing_helps()


def test_under_a_tight_budget_the_cheap_type_wins():
    job = Job(RESNET, global_batch=128, steps=40_000)
    cands = catalog_cands(MIX, job)
    cheap = Evaluator(cands, job)((1, 0, 0))
    rec = search(cands, job, Objective("budget", budget_usd=cheap.cost_usd * 1.05))
    assert rec.best.counts == (1, 0, 0)
    loose = search(cands, job, Objective("budget", budget_usd=1000))
    assert loose.best.hours < rec.best.hours and loose.best.counts[2] > 0


@pytest.mark.parametrize("deadline_h", [0.2, 0.5, 1.0, 3.0])
def test_the_deadline_is_respected_at_the_least_cost(deadline_h):
    job = Job(RESNET, global_batch=512, steps=10_000)
    cands = catalog_cands(MIX, job)
    rec = search(cands, job, Objective("deadline", deadline_h=deadline_h))
    assert rec.best.hours <= deadline_h
    meets = [p for p in rec.ranked if p.hours <= deadline_h]
    assert rec.best.cost_usd == min(p.cost_usd for p in meets)


def test_a_margin_keeps_a_share_of_the_deadline_in_hand():
    """With the deadline set just above the cheapest in-time mix's prediction, a 15% margin
    moves the choice to a mix predicted to finish by 0.85 x the deadline, at a higher cost."""
    job = Job(RESNET, global_batch=512, steps=10_000)
    cands = catalog_cands(MIX, job)
    bare = search(cands, job, Objective("deadline", deadline_h=1.0))
    deadline = bare.best.hours * 1.01
    tight = search(cands, job, Objective("deadline", deadline_h=deadline))
    kept = search(cands, job, Objective("deadline", deadline_h=deadline, margin=0.15))
    assert tight.best.counts == bare.best.counts
    assert kept.best.hours <= 0.85 * deadline < tight.best.hours
    assert kept.best.cost_usd >= tight.best.cost_usd


def test_the_cli_defaults_to_a_margin_and_refuses_a_bad_one(tmp_path, capsys):
    from hetflow.config import DEADLINE_MARGIN

    assert main(["recommend", "--deadline-h", "0.001", "-o", str(tmp_path / "c.yaml")]) == 2
    assert f"less a {DEADLINE_MARGIN:.0%} margin" in capsys.readouterr().err
    for flags in (["--deadline-h", "2", "--deadline-margin", "1"], ["--deadline-margin", "0.1"]):
        assert main(["recommend", *flags]) == 2
        err = capsys.readouterr().err
        assert err.startswith("hetflow: error: --deadline-margin: ") and err.count("\n") == 1


def test_a_deadline_no_mix_meets_names_the_fastest():
    job = Job(RESNET, global_batch=384, steps=10_000)
    cands = catalog_cands("p3.2xlarge:1,g4dn.xlarge:1", job)
    with pytest.raises(RecommendError, match=r"the fastest, .* is predicted [\d.]+ h"):
        search(cands, job, Objective("deadline", deadline_h=0.01))


OBJECTIVES = [
    Objective(),
    Objective("deadline", deadline_h=0.4),
    Objective("budget", budget_usd=5.0),
]


@pytest.mark.parametrize("objective", OBJECTIVES, ids=lambda o: o.kind)
@pytest.mark.parametrize("mix", [MIX, "g4dn.xlarge:40,g4dn.12xlarge:8,p3.2xlarge:30,p3.8xlarge:6"])
def test_the_chosen_mix_is_never_worse_than_any_single_type(objective, mix):
    """Exhaustive or pruned (the second mix allows too many mixes to price them all)."""
    job = Job(RESNET, global_batch=512, steps=10_000)
    cands = catalog_cands(mix, job)
    rec = search(cands, job, objective)
    for alone in singles(cands, job):
        assert objective.key(rec.best) <= objective.key(alone), alone.label(cands)


def test_a_mix_wins_where_neither_type_alone_meets_the_deadline():
    job = Job(RESNET, global_batch=256, steps=1000)
    fast = affine("fast", 1, 10.0, 0.01, 0.001, 256)  # 266 ms at 256
    slow = affine("slow", 4, 1.0, 0.01, 0.004, 256)  # 4 of them: 266 ms
    cands = [fast, slow]
    alone = min(p.hours for p in singles(cands, job))
    rec = search(cands, job, Objective("deadline", deadline_h=alone * 0.8))
    assert rec.mixing_helps() and rec.best.hours <= alone * 0.8
    assert "a mix helps" in mixing_line(rec)


def test_a_type_too_slow_to_take_a_sample_is_not_rented():
    job = Job(RESNET, global_batch=64, steps=100)
    fast = affine("fast", 1, 1.0, 0.001, 0.0001, 64)  # 7.4 ms for the whole batch
    crawl = affine("crawl", 2, 0.01, 1.0, 0.1, 64)  # 1.1 s for one sample
    ev = Evaluator([fast, crawl], job)
    assert ev((1, 1)) is None  # it would idle: the mix without it is as fast and cheaper
    rec = search([fast, crawl], job, Objective("budget", budget_usd=100))
    assert rec.best.counts == (1, 0)


@pytest.mark.parametrize("batch", [7, 100, 1000])
def test_the_batch_plan_sums_to_the_global_batch_and_finishes_together(batch):
    job = Job(RESNET, global_batch=batch, steps=10)
    cands = [affine("a", 2, 1.0, 0.002, 0.001, batch), affine("b", 3, 1.0, 0.002, 0.003, batch)]
    ev = Evaluator(cands, job)
    p = ev((2, 3))
    plan = local_batches(cands, p, batch)
    assert sum(map(sum, plan)) == batch and min(map(min, plan)) >= 1
    steps = [c.step_s[b - 1] for c, bs in zip(cands, plan, strict=True) for b in bs]
    assert max(steps) == pytest.approx(p.compute_s)
    # T is the least: a hair less, and the devices hold fewer samples than the global batch
    held = sum(c.batch_within(p.compute_s * (1 - 1e-9)) * len(bs) for c, bs in zip(cands, plan))
    assert held < batch


def test_the_pareto_front_is_sorted_and_undominated():
    job = Job(RESNET, global_batch=512, steps=10_000)
    rec = search(catalog_cands(MIX, job), job, Objective())
    hours = [p.hours for p in rec.front]
    costs = [p.cost_usd for p in rec.front]
    assert hours == sorted(hours) and costs == sorted(costs, reverse=True)
    assert rec.best in rec.front  # the least cost is on it


# -- the command line ---------------------------------------------------------------------------


BAD = [
    (["--candidates", "g9.xlarge:2"], "g9.xlarge is not in the offline catalog"),
    (["--candidates", "g5.xlarge:2,p3.2xlarge:1"], "g5.xlarge (A10G) has no step-time curve"),
    (["--candidates", "g4dn.xlarge:0"], "--candidates: expected TYPE:COUNT"),
    (["--budget", "0.3"], "less than one instance-hour of the cheapest candidate, g4dn.xlarge"),
    (["--deadline-h", "0.001"], "finishes 10000 steps in 0.00085 h (0.001 h less a 15% margin)"),
    (["--budget", "1", "--steps", "10000000"], "no mix of the candidates finishes 10000000"),
    (["--steps", "0"], "--steps: Input should be greater than or equal to 1 (got 0)"),
    (["--budget", "5", "--deadline-h", "2"], "not allowed with argument"),
]


@pytest.mark.parametrize("flags, message", BAD, ids=[m[:30] for _, m in BAD])
def test_bad_input_is_one_line(flags, message, capsys, tmp_path):
    out = tmp_path / "c.yaml"
    assert main(["recommend", "-o", str(out), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hetflow: error: ") and err.count("\n") == 1
    assert message in err
    assert not out.exists()


def test_the_cluster_file_round_trips_and_names_the_presets(tmp_path, capsys):
    out, figures = tmp_path / "c.yaml", tmp_path / "r.json"
    flags = ["--candidates", "g4dn.xlarge:2,p3.2xlarge:1", "--global-batch", "640"]
    flags += ["--steps", "1000", "--budget", "20", "-o", str(out), "--json", str(figures)]
    flags += ["--plot", str(tmp_path / "front.png")]
    assert main(["recommend", *flags]) == 0
    printed = capsys.readouterr().out
    assert "a mix helps" in printed and "why it loses" in printed
    cluster = ClusterSpec.from_file(out)
    assert [(w.instance_type, w.preset) for w in cluster.workers] == [
        ("g4dn.xlarge", "t4"),
        ("g4dn.xlarge", "t4"),
        ("p3.2xlarge", "v100"),
    ]
    assert len({w.node for w in cluster.workers}) == 3
    # the Ray launcher's config beside it (checked by Ray's schema when written), a node type
    # per instance type with as many nodes as the mix rents, as `hetflow cluster config` writes
    ray_config = yaml.safe_load((tmp_path / "c-ray.yaml").read_text())
    nodes = {k: v["min_workers"] for k, v in ray_config["available_node_types"].items()}
    assert nodes == {"head": 0, "g4dn_xlarge": 2, "p3_2xlarge": 1}
    assert f"`ray up {tmp_path / 'c-ray.yaml'}`" in printed
    data = json.loads(figures.read_text())
    assert sum(map(sum, data["chosen"]["local_batches"])) == 640
    assert data["chosen"]["mix"] == {"g4dn.xlarge": 2, "p3.2xlarge": 1}
    assert (tmp_path / "front.png").read_bytes()[:4] == b"\x89PNG"


def test_a_multi_gpu_instance_is_one_node_of_several_workers(tmp_path, capsys):
    out = tmp_path / "c.yaml"
    flags = ["--candidates", "p3.8xlarge:1", "--steps", "100", "-o", str(out)]
    assert main(["recommend", *flags]) == 0
    cluster = ClusterSpec.from_file(out)
    assert cluster.world_size == 4 and {w.node for w in cluster.workers} == {"p3-8xlarge-0"}
    assert f"wrote {out} (4 workers)" in capsys.readouterr().out


def test_recipe_lists_each_model_once_and_still_takes_an_old_name(tmp_path, capsys):
    from hetflow.cli import build_parser
    from hetflow.forecast.simulate.models import NAMES

    rec = build_parser()._subparsers._group_actions[0].choices["recommend"]
    assert "{" + ",".join(NAMES) + "}" in rec.format_help()
    assert not {"mlp", "cnn", "wide_mlp"} & set(NAMES)
    out = tmp_path / "c.yaml"
    flags = ["--recipe", "cnn", "--steps", "100", "-o", str(out), "--ray-config", ""]
    assert main(["recommend", *flags]) == 0
    assert capsys.readouterr().out.startswith("hetflow recommend: digits-cnn (mixed precision),")


def test_one_worker_is_counted_in_the_singular(tmp_path, capsys):
    out = tmp_path / "c.yaml"
    flags = ["--candidates", "p3.2xlarge:1", "--global-batch", "128", "--steps", "100"]
    flags += ["-o", str(out), "--ray-config", ""]
    assert main(["recommend", *flags]) == 0
    assert f"wrote {out} (1 worker);" in capsys.readouterr().out


def test_recommend_imports_neither_torch_prefect_nor_mlflow(tmp_path):
    code = (
        "import json, sys\n"
        "from hetflow.cli import main\n"
        f"main(['recommend', '-o', {str(tmp_path / 'c.yaml')!r}])\n"
        "print(json.dumps([m for m in ('torch', 'prefect', 'mlflow') if m in sys.modules]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(proc.stdout.splitlines()[-1]) == []


PRUNED = [
    Objective("deadline", deadline_h=0.06),
    Objective("budget", budget_usd=4.0),
    Objective("budget", budget_usd=8.0),
]


@pytest.mark.parametrize("objective", PRUNED, ids=lambda o: f"{o.kind}")
def test_the_pruned_search_finds_what_the_exhaustive_one_finds(objective, monkeypatch):
    """On made-up types where mixing pays (a fast network): pricing every one of the 1,620
    mixes, and pricing the grid then climbing, choose alike."""
    job = Job(RESNET, global_batch=512, steps=10_000)
    cands = [
        affine("big", 2, 30.0, 0.004, 0.0004, 512, devices=8),
        affine("mid", 11, 3.0, 0.004, 0.0008, 512),
        affine("small", 8, 0.5, 0.008, 0.004, 512),
        affine("tiny", 4, 0.2, 0.02, 0.01, 512),
    ]
    full = search(cands, job, objective)
    monkeypatch.setattr("hetflow.forecast.rent.search.EXHAUSTIVE", 10)
    pruned = search(cands, job, objective)
    assert pruned.evaluated < full.evaluated
    assert objective.key(pruned.best) == objective.key(full.best)
    if objective.kind == "budget":
        assert pruned.mixing_helps()


def test_the_recommend_page_s_commands_run_as_written(tmp_path, monkeypatch, hetflow_home):
    """Each `hetflow recommend` of docs/recommend.md that needs no profile history succeeds:
    a change to the model (a memory cap, the deadline's margin) that makes one fail shows."""
    import shlex
    from pathlib import Path

    from tests.unit.cli.test_docs_commands import commands

    page = Path(__file__).resolve().parents[3] / "docs" / "recommend.md"
    lines = [
        c
        for c in commands(page.read_text())
        if c.startswith("hetflow recommend ") and "--profiles" not in c
    ]
    assert len(lines) == 5
    monkeypatch.chdir(tmp_path)
    for line in lines:
        assert main(shlex.split(line)[1:]) == 0, line


def test_the_saving_the_recommend_page_cites_is_on_a_job_recommend_accepts(tmp_path, capsys):
    """docs/recommend.md's 'Where a mix saves': recommend takes the job within every memory cap
    and chooses the mix the page names, at the figures it gives."""
    figures = tmp_path / "r.json"
    flags = ["--candidates", "g4dn.xlarge:4,p3.2xlarge:2", "--global-batch", "512"]
    flags += ["--steps", "10000", "--deadline-h", "1.5", "--json", str(figures)]
    assert main(["recommend", *flags, "-o", str(tmp_path / "c.yaml"), "--ray-config", ""]) == 0
    data = json.loads(figures.read_text())
    assert data["chosen"]["mix"] == {"g4dn.xlarge": 3, "p3.2xlarge": 1}
    assert round(data["chosen"]["cost_usd"], 2) == 5.81
    caps = data["memory_caps"]
    assert all(b <= caps[t] for t, bs in zip(caps, data["chosen"]["local_batches"]) for b in bs)
