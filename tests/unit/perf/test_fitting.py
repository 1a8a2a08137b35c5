"""The probes' line fits (hetflow.perf.fitting), pure: no torch, no cluster."""

from __future__ import annotations

import pytest

from hetflow.perf.fitting import fit_affine, fit_transfer, robust_affine


def test_fit_affine_recovers_latency_and_slope():
    a, b = fit_affine([8, 16, 32, 64], [0.01 + 0.002 * x for x in (8, 16, 32, 64)])
    assert (a, b) == (pytest.approx(0.01), pytest.approx(0.002))
    with pytest.raises(ValueError, match="two distinct"):
        fit_affine([8, 8], [1, 2])


def test_robust_fit_leaves_out_one_batch_size_spoiled_by_a_burst_of_load():
    sizes = [8, 16, 32, 64]
    clean = [0.1 + 0.003 * b for b in sizes]
    spoiled = [*clean[:3], clean[3] * 2.2]  # most samples at batch 64 fell into a burst
    a, b, dropped = robust_affine(sizes, spoiled)
    assert dropped == 64 and (a, b) == (pytest.approx(0.1), pytest.approx(0.003))
    noisy = [t * f for t, f in zip(clean, [1.05, 0.97, 1.04, 0.98], strict=True)]
    assert robust_affine(sizes, noisy)[2] is None  # ordinary noise keeps every point


def test_transfer_fit_takes_latency_from_the_smallest_message():
    nbytes = [65_536, 524_288, 2_097_152]
    # 0.5 Gbit/s; the small messages woke up 3 ms late (a busy host), the large one did not
    ts = [3e-3 + nbytes[0] * 8 / 0.5e9, 3e-3 + nbytes[1] * 8 / 0.5e9, nbytes[2] * 8 / 0.5e9]
    latency, slope = fit_transfer(nbytes, ts)
    assert 8 / slope / 1e9 == pytest.approx(0.5, rel=0.15) and latency >= 0


def test_fitting_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, hetflow.perf.fitting; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
