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
from hetflow.forecast.simulate.memory import (
    GIB,
    MEMORY_MARGIN,
    MIB,
    device_limit,
    largest_batch,
    state_bytes,
)
from hetflow.forecast.simulate.models import MODELS
from hetflow.forecast.simulate.published import TABLES
from hetflow.infra.market import load_market

RESNET = MODELS["resnet50"]
T4_MIX = "g4dn.xlarge:4,g4dn.12xlarge:2"


def run(flags: list[str], tmp_path, capsys) -> tuple[dict, str]:
    figures = tmp_path / "r.json"
    out = tmp_path / "c.yaml"
    assert main(["recommend", *flags, "-o", str(out), "--json", str(figures)]) == 0
    return json.loads(figures.read_text()), capsys.readouterr().out


def test_on_a_t4_mix_resnet50_stays_within_16_gb_less_its_margin(tmp_path, capsys):
    """At a global batch the T4s would otherwise take in fewer, larger batches (they are the
    cheapest per sample), every T4's local batch and the model's state fit its 16 GB less the
    margin, and the note names the precision the cap assumes."""
    t4_bytes = load_market().types["g4dn.xlarge"].gpu_memory_mib * MIB
    assert t4_bytes == 16 * GIB
    cap = device_limit(RESNET, "T4", 16384, None).cap
    flags = ["--candidates", T4_MIX, "--global-batch", str(8 * cap), "--steps", "1000"]
    data, printed = run([*flags, "--ray-config", ""], tmp_path, capsys)
    batches = [b for per_type in data["chosen"]["local_batches"] for b in per_type]
    assert sum(batches) == 8 * cap and len(batches) > 1
    for b in batches:
        held = state_bytes(RESNET.params) + b * RESNET.sample_memory_bytes
        assert held <= (1 - MEMORY_MARGIN) * t4_bytes
    assert data["memory_caps"]["g4dn.12xlarge"] == cap
    assert max(batches) == cap  # cheapest per sample: as large as memory allows, no larger
    assert f"capped at {cap} by memory (16 GiB T4 less a 10% margin" in printed
    assert "in mixed precision" in printed
    assert "configs.yml" in printed  # the published configuration the figure comes from


def test_the_t4s_cap_keeps_a_margin_below_the_published_batch_on_16_gb():
    """The published configuration trains 256 a GPU on a 16 GB V100: a T4 of 16 GB, which
    hands out less of it, is not capped at that batch with nothing to spare."""
    cap = device_limit(RESNET, "T4", 16384, None).cap
    assert cap < 256
    room = (1 - MEMORY_MARGIN) * 16 * GIB - state_bytes(RESNET.params)
    assert cap * RESNET.sample_memory_bytes <= room < (cap + 1) * RESNET.sample_memory_bytes


@pytest.mark.parametrize("model", ["resnet50", "bert-large"])
@pytest.mark.parametrize("device_gib", [16, 32, 80])
def test_an_fp32_job_takes_twice_the_memory_a_sample_and_about_half_the_batch(model, device_gib):
    spec = MODELS[model]
    mixed = device_limit(spec, "GPU", device_gib * 1024, None, "mixed")
    fp32 = device_limit(spec, "GPU", device_gib * 1024, None, "fp32")
    room = (1 - MEMORY_MARGIN) * device_gib * GIB - state_bytes(spec.params)
    per_sample = 2 * spec.sample_memory_bytes  # activations in 4 bytes, not 2
    assert fp32.cap == int(room // per_sample)
    assert fp32.cap in (mixed.cap // 2, (mixed.cap + 1) // 2)
    assert "fp32 precision, activations of 4 bytes" in fp32.why


def test_the_fp32_caps_sit_near_the_published_fp32_configurations():
    """NVIDIA's fp32 configurations on a 16 GB V100 (the published tables' local batches):
    the fp32 caps are at most those batches, and not far under them."""
    tables = {t.model: t.local_batch for t in TABLES if t.key.endswith("dgx1-fp32")}
    for model, published in tables.items():
        cap = device_limit(MODELS[model], "V100", 16384, None, "fp32").cap
        assert 0.7 * published <= cap <= published + 3


def test_recommend_takes_the_precision_and_an_fp32_job_gets_its_own_cap(tmp_path, capsys):
    flags = ["--candidates", "g4dn.xlarge:4", "--global-batch", "256", "--steps", "100"]
    mixed, _ = run([*flags, "--ray-config", ""], tmp_path, capsys)
    fp32, printed = run([*flags, "--precision", "fp32", "--ray-config", ""], tmp_path, capsys)
    assert fp32["memory_caps"]["g4dn.xlarge"] < mixed["memory_caps"]["g4dn.xlarge"]
    assert (
        max(b for bs in fp32["chosen"]["local_batches"] for b in bs)
        <= (fp32["memory_caps"]["g4dn.xlarge"])
    )
    assert printed.startswith("hetflow recommend: resnet50 (fp32 precision)")
    assert fp32["job"]["precision"] == "fp32" and mixed["job"]["precision"] == "mixed"


def test_an_unknown_precision_is_refused_in_one_line(capsys):
    assert main(["recommend", "--precision", "fp16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--precision" in err


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
    room = (1 - MEMORY_MARGIN) * device_gib * GIB  # the margin kept
    assert held + spec.sample_memory_bytes > room  # one sample more does not fit
    assert held <= room or limit.cap == 0  # 0: not even the state and one sample


def test_a_device_without_known_memory_is_not_checked_and_says_why():
    limit = device_limit(RESNET, None, 0, None)
    assert limit.cap is None and "no device memory" in limit.note("c5.xlarge", 10)
