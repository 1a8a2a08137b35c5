"""Recommend within each device's memory: the largest local batch from the model's memory per
sample and state against the device's memory, or a measured cap from the profile history;
capped batches and unknown memory said in the notes."""

from __future__ import annotations

import json

import pytest

from hetflow.cli import main
from hetflow.config import RecommendJob, RecommendRequest, RentableType
from hetflow.forecast.rent.measured import MeasuredCurve
from hetflow.forecast.rent.recommend import recommend
from hetflow.forecast.rent.rental import History
from hetflow.forecast.simulate.memory import GIB, MIB, device_limit, largest_batch, state_bytes
from hetflow.forecast.simulate.models import MODELS
from hetflow.infra.market import load_market

RESNET = MODELS["resnet50"]
T4_MIX = "g4dn.xlarge:4,g4dn.12xlarge:2"


def run(flags: list[str], tmp_path, capsys) -> tuple[dict, str]:
    figures = tmp_path / "r.json"
    out = tmp_path / "c.yaml"
    assert main(["recommend", *flags, "-o", str(out), "--json", str(figures)]) == 0
    return json.loads(figures.read_text()), capsys.readouterr().out


def test_on_a_t4_mix_resnet50_stays_within_16_gb(tmp_path, capsys):
    """At a global batch one T4 would otherwise take whole (it is the cheapest per sample),
    every T4's local batch and the model's state fit its 16 GB."""
    t4_bytes = load_market().types["g4dn.xlarge"].gpu_memory_mib * MIB
    assert t4_bytes == 16 * GIB
    flags = ["--candidates", T4_MIX, "--global-batch", "2048", "--steps", "1000"]
    data, printed = run([*flags, "--ray-config", ""], tmp_path, capsys)
    batches = [b for per_type in data["chosen"]["local_batches"] for b in per_type]
    assert sum(batches) == 2048 and len(batches) > 1
    for b in batches:
        assert state_bytes(RESNET.params) + b * RESNET.sample_memory_bytes <= t4_bytes
    cap = data["memory_caps"]["g4dn.12xlarge"]
    assert max(batches) == cap  # cheapest per sample: as large as memory allows, no larger
    assert f"capped at {cap} by memory (16 GiB T4" in printed
    assert "configs.yml" in printed  # the published configuration the figure comes from


def test_a_global_batch_past_every_cap_is_refused_naming_the_caps(tmp_path, capsys):
    out = tmp_path / "c.yaml"
    flags = ["--candidates", "g4dn.xlarge:2", "--global-batch", "4096", "-o", str(out)]
    assert main(["recommend", *flags]) == 2
    err = capsys.readouterr().err
    cap = largest_batch(16 * GIB, RESNET.params, RESNET.sample_memory_bytes)
    assert err.count("\n") == 1 and f"(the most per GPU: g4dn.xlarge {cap})" in err


def test_where_memory_cannot_be_known_the_recommendation_says_so(tmp_path, capsys):
    assert MODELS["digits-mlp"].sample_memory_bytes is None
    flags = ["--recipe", "digits-mlp", "--candidates", "g4dn.xlarge:2", "--steps", "100"]
    data, printed = run([*flags, "--ray-config", ""], tmp_path, capsys)
    assert data["memory_caps"] == {"g4dn.xlarge": None}
    assert "g4dn.xlarge: memory not checked (no memory per sample is known for digits-mlp)" in (
        printed
    )


def test_a_measured_cap_from_the_history_wins_over_the_published_figure():
    curve = MeasuredCurve(0.01, 0.001, 100, "s3://h/g4dn.xlarge-x")
    history = History("s3://h", 24.0, {"g4dn.xlarge": curve}, {})
    request = RecommendRequest(
        job=RecommendJob(global_batch=200, steps=100),
        candidates=[RentableType(instance_type="g4dn.xlarge", count=4)],
    )
    rec = recommend(request, history, load_market())
    assert [b for bs in rec.batches for b in bs] == [100, 100]  # two devices at the cap
    assert any("capped at 100 by memory (measured" in n for n in rec.all_notes())


@pytest.mark.parametrize("device_gib", [4, 16, 40, 80])
@pytest.mark.parametrize("model", ["resnet50", "bert-large"])
def test_the_cap_is_the_most_samples_beside_the_state(device_gib, model):
    spec = MODELS[model]
    limit = device_limit(spec, "GPU", device_gib * 1024, None)
    held = state_bytes(spec.params) + limit.cap * spec.sample_memory_bytes
    assert held + spec.sample_memory_bytes > device_gib * GIB  # one sample more does not fit
    assert held <= device_gib * GIB or limit.cap == 0  # 0: not even the state and one sample


def test_a_device_without_known_memory_is_not_checked_and_says_why():
    limit = device_limit(RESNET, None, 0, None)
    assert limit.cap is None and "no device memory" in limit.note("c5.xlarge", 10)
