"""`hetflow bench recommend --cpu-quotas`: recommend checked on real workers under kernel CPU
quotas. The quota rule (published peaks only), the mixes run, the figures that set measured
beside predicted (pure); bad input in one line; one short real run on two workers (slow)."""

from __future__ import annotations

import json
import os

import pytest

from hetflow.training.cpu_quota import find_controller

from benchmarks.recommend import main
from benchmarks.recommend.quota_figures import (
    relative_error,
)

CONTROLLER = find_controller()


needs_quotas = pytest.mark.skipif(
    CONTROLLER is None or not os.access(CONTROLLER.root, os.W_OK),
    reason="no writable cgroup CPU controller on this host (needs root and cgroup v1/v2 'cpu')",
)


@pytest.mark.slow
@pytest.mark.timeout(900)
@needs_quotas
def test_a_short_real_check_on_two_workers_reports_each_measured(tmp_path):
    path = tmp_path / "q.json"
    argv = [
        "--cpu-quotas",
        "--candidates",
        "g4dn.xlarge:2,p3.2xlarge:1",
        "--global-batch",
        "32",
        "--run-steps",
        "6",
        "--mixes",
        "4",
        "--max-ranks",
        "2",
        "--json",
        str(path),
    ]
    assert main(argv) == 0
    out = json.loads(path.read_text())
    assert set(out["profiles"]) == {"g4dn.xlarge", "p3.2xlarge"}
    # every mix of at most 2 GPUs is run: g4dn.xlarge x2 among them, two real workers (and
    # the two types together where the profiles let both take a share of 32)
    assert any(len(r["workers"]) == 2 for r in out["runs"])
    for run in out["runs"]:
        assert len(run["workers"]) == len(run["local_batches"]) and sum(run["local_batches"]) == 32
        for w in run["workers"]:
            assert w["measured_compute_s"] > 0
            assert "throttled_share" in w
            assert w["kernel_cpu_quota"] == w["cpu_quota"] == out["quota_rule"][w["instance_type"]]
        assert run["step_error"] == pytest.approx(
            relative_error(run["measured_step_s"], run["predicted_step_s"])
        )
        assert run["cost_error"] == pytest.approx(
            relative_error(run["measured_cost_usd"], run["predicted_cost_usd"])
        )
