"""Devices, the backend and mixed precision: the policy on any host, and ranks of different
precisions that still step on one exact gradient (CPU autocast, 4 processes)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hetflow.config import ClusterSpec, ConfigError, TrainConfig, WorkerSpec, check_job
from hetflow.training.devices import (
    HostDevices,
    MixedPrecision,
    backend_for,
    check_devices,
    rank_device_precision,
    resolve_device,
    resolve_precision,
)

from tests.dist import run_ranks

NO_GPU = HostDevices()


T4 = (7, 5)


A100 = (8, 0)


def gpus(*caps) -> HostDevices:
    return HostDevices(tuple(caps), tuple(16 * 2**30 for _ in caps))


def cluster(*workers: dict) -> ClusterSpec:
    return ClusterSpec(workers=[WorkerSpec(name=f"w{i}", **w) for i, w in enumerate(workers)])


def test_auto_is_the_local_ranks_gpu_else_the_cpu():
    assert resolve_device("auto", 0, NO_GPU) == "cpu"
    assert [resolve_device("auto", r, gpus(A100, A100)) for r in range(4)] == [
        "cuda:0",
        "cuda:1",
        "cuda:0",
        "cuda:1",
    ]
    assert resolve_device("cpu", 1, gpus(A100)) == "cpu"
    assert resolve_device("cuda", 1, gpus(A100, T4)) == "cuda:1"


def test_cuda_on_a_host_without_one_names_the_worker():
    spec = cluster({}, {"device": "cuda"})
    with pytest.raises(ConfigError, match=r"^cluster\.workers\[w1\]\.device: 'cuda', but this"):
        check_devices(spec, TrainConfig(), NO_GPU)


@pytest.mark.parametrize(
    ("devices", "backend"),
    [
        (["cuda:0", "cuda:1"], "nccl"),
        (["cuda:0", "cuda:0"], "gloo"),  # emulated workers sharing one GPU: NCCL cannot
        (["cuda:0", "cpu"], "gloo"),  # gloo carries the CUDA tensors of a mixed cluster
        (["cpu", "cpu"], "gloo"),
    ],
)
def test_nccl_only_when_every_rank_has_a_gpu_of_its_own(devices, backend):
    assert backend_for(devices) == backend


def test_check_devices_places_a_mixed_cluster_over_gloo():
    spec = cluster({"device": "cuda"}, {"device": "cpu"}, {"device": "auto"})
    placed = check_devices(spec, TrainConfig(precision="auto"), gpus(A100, T4))
    assert placed.devices == ["cuda:0", "cpu", "cuda:0"]
    assert placed.precisions == ["bf16", "fp32", "bf16"]
    assert placed.backend == "gloo" and not placed.scaled
    assert check_devices(cluster({}, {}), TrainConfig(), gpus(A100, T4)).backend == "nccl"


def test_auto_precision_reads_the_capability_not_the_emulation():
    assert resolve_precision("auto", "cuda:0", gpus(A100)) == "bf16"
    assert resolve_precision("auto", "cuda:0", gpus(T4)) == "fp16"  # T4, V100: fp16 + scaler
    assert resolve_precision("auto", "cpu", NO_GPU) == "fp32"
    assert resolve_precision("bf16", "cpu", NO_GPU) == "bf16"  # CPU autocast


def test_bf16_on_a_gpu_without_it_names_the_field():
    with pytest.raises(ConfigError, match=r"^train\.precision: 'bf16', but cuda:0 \(compute "):
        check_devices(cluster({}), TrainConfig(precision="bf16"), gpus(T4))
    spec = cluster({}, {"precision": "bf16"})
    with pytest.raises(ConfigError, match=r"^cluster\.workers\[w1\]\.precision: 'bf16'"):
        check_devices(spec, TrainConfig(), gpus(A100, T4))


def test_a_rank_resolves_its_own_device_and_refuses_a_cpu_under_nccl():
    spec = cluster({}, {})
    assert rank_device_precision(spec, TrainConfig(), 1, 1, "gloo", gpus(A100, A100)) == (
        "cuda:1",
        "fp32",
    )
    with pytest.raises(ConfigError, match=r"^cluster\.workers\[w0\]\.device: the job runs over"):
        rank_device_precision(spec, TrainConfig(), 0, 0, "nccl", NO_GPU)


def test_fp16_with_local_sgd_is_refused():
    train = TrainConfig(precision="fp16", compression="localsgd:4")
    with pytest.raises(ConfigError, match=r"^train\.precision: fp16 scales the loss"):
        check_job(cluster({}, {}), train)
    # 'auto' resolves to fp16 only on the host: refused there, before launch
    with pytest.raises(ConfigError, match=r"^cluster\.workers\[w0\]\.precision: resolves to fp16"):
        check_devices(
            cluster({}, {}), TrainConfig(precision="auto", compression="localsgd:4"), gpus(T4, T4)
        )


# -- ranks of mixed precision (run by tests.dist.run_ranks) -------------------------------------

STEPS, LOCAL = 12, 8


def _data(world: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(STEPS, world * LOCAL, 16, generator=g)
    return x, torch.randint(0, 4, (STEPS, world * LOCAL), generator=g)


def _model() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def mixed_precision_rank(rank: int, world: int, arg: dict) -> dict:
    """Train STEPS steps in this rank's precision with the loss scale every rank shares; the
    parameters' bytes after each step and the steps the scaler skipped."""
    amp = MixedPrecision("cpu", arg["precisions"][rank], scaled=True, init_scale=arg["scale"])
    model = _model()
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=1.0)
    x, y = _data(world)
    after, skipped = [], []
    for step in range(STEPS):
        mine = slice(rank * LOCAL, (rank + 1) * LOCAL)
        with amp.autocast():
            loss = nn.functional.cross_entropy(ddp(x[step, mine]), y[step, mine])
        amp.scale(loss).backward()
        amp.step(opt)
        opt.zero_grad(set_to_none=True)
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        after.append(flat.tolist())
        skipped.append(amp.last_skipped)
    return {"after": after, "skipped": skipped}


def test_ranks_of_bf16_and_fp16_step_alike_and_match_one_process(tmp_path):
    precisions = ["bf16", "bf16", "fp16", "fp16"]
    # a scale far too large for fp16: the fp16 ranks overflow, and every rank must skip
    # those steps alike and back off the scale alike
    out = run_ranks(mixed_precision_rank, 4, {"precisions": precisions, "scale": 2.0**22}, tmp_path)
    for r in out[1:]:
        assert r["skipped"] == out[0]["skipped"]
        assert r["after"] == out[0]["after"]  # bit for bit, after every step
    skipped = out[0]["skipped"]
    assert any(skipped) and not all(skipped)
    # one process, fp32, on the global batch, stepping where the ranks stepped
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    x, y = _data(4)
    for step in range(STEPS):
        if not skipped[step]:
            nn.functional.cross_entropy(model(x[step]), y[step]).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    ref = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    start = torch.cat([p.detach().reshape(-1) for p in _model().parameters()])
    moved = (ref - start).abs().max()
    error = (torch.tensor(out[0]["after"][-1]) - ref).abs().max()
    print(f"moved {moved:.4f}, off fp32 by {error:.5f}")
    # bf16 keeps 8 bits of mantissa: a few % of the move; a rank left out would be ~25%
    assert error < 0.1 * moved


def test_without_fp16_nothing_is_scaled():
    amp = MixedPrecision("cpu", "bf16", scaled=False)
    loss = torch.tensor(2.0)
    assert amp.scale(loss) is loss and amp.state_dict() == {}
