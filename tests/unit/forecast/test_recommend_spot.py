"""`hetflow recommend --market spot|both`: the expected time with interruptions (a case worked
by hand from `hetflow/forecast/rent/spot.py`'s formula), spot chosen where its discount pays and not
where interruptions eat it, the spot table and its overrides, and bad input in one line."""

from __future__ import annotations

import json

import pytest

from hetflow.cli import main
from hetflow.config import TrainConfig
from hetflow.forecast.rent.search import Candidate, Evaluator, Job
from hetflow.forecast.rent.spot import DEFAULT_RESTART, Restart
from hetflow.forecast.simulate.models import MODELS

RESNET = MODELS["resnet50"]


def run(flags: list[str], tmp_path, capsys) -> tuple[int, dict, str, str]:
    """`hetflow recommend FLAGS`: (exit status, --json figures, stdout, stderr)."""
    out, figures = tmp_path / "c.yaml", tmp_path / "r.json"
    out.unlink(missing_ok=True)
    code = main(["recommend", *flags, "-o", str(out), "--json", str(figures)])
    captured = capsys.readouterr()
    data = json.loads(figures.read_text()) if code == 0 else {}
    if code:
        assert not out.exists()
    return code, data, captured.out, captured.err


# -- the model, by hand ----------------------------------------------------------------------


def test_the_expected_time_is_the_docstrings_closed_form_worked_by_hand():
    """One device, step 0.01 + 0.001 x 100 = 0.11 s, 36,000 steps: T0 = 1.1 h. Interrupted
    0.5 times an hour; each costs 60 s of restart + 200 / 2 steps x 0.11 s = 71 s. Then
    T = T0 / (1 - 0.5 x 71 / 3600) = 1.1 x 3600 / 3564.5 h, N = 0.5 T, cost $4/h x T."""
    steps = tuple(0.01 + 0.001 * b for b in range(1, 101))
    cand = Candidate("one", 1, 10.0, 1, "A100", "a100", 1e6, steps, 4.0, 0.5)
    job = Job(RESNET, global_batch=100, steps=36_000)
    restart = Restart(restart_s=60, checkpoint_every=200)
    demand = Evaluator([cand], job)((1,))
    spot = Evaluator([cand], job, "spot", restart)((1,))

    t = 1.1 * 3600 / 3564.5
    assert demand.hours == pytest.approx(1.1) and demand.cost_usd == pytest.approx(11.0)
    assert spot.bare_hours == pytest.approx(1.1)
    assert spot.hours == pytest.approx(t)
    assert spot.interruptions == pytest.approx(0.5 * t)
    assert spot.cost_usd == pytest.approx(4.0 * t) and spot.usd_per_hour == 4.0
    # the fixed point it solves: every interruption, the restarts' included, costs 71 s
    assert spot.hours == pytest.approx(1.1 + spot.interruptions * 71 / 3600)


def test_a_mix_interrupted_faster_than_it_recovers_is_not_priced():
    steps = tuple(0.01 + 0.001 * b for b in range(1, 101))
    cand = Candidate("one", 1, 10.0, 1, "A100", "a100", 1e6, steps, 4.0, 60.0)  # once a minute
    job = Job(RESNET, global_batch=100, steps=1000)
    assert Evaluator([cand], job, "spot", Restart(restart_s=60))((1,)) is None
    assert Evaluator([cand], job, "spot", Restart(restart_s=30))((1,)) is not None


def test_the_default_restart_is_the_measured_one_and_trainconfigs_checkpoint_interval():
    assert DEFAULT_RESTART.checkpoint_every == TrainConfig().checkpoint_every
    assert DEFAULT_RESTART.restart_s > 0


# -- the choice ------------------------------------------------------------------------------

FLAGS = ["--candidates", "g4dn.xlarge:2,p3.2xlarge:1", "--global-batch", "512", "--steps", "5000"]


def test_spot_wins_where_its_discount_pays(tmp_path, capsys):
    code, demand, _, _ = run(FLAGS, tmp_path, capsys)
    assert code == 0 and demand["chosen"]["market"] == "on-demand"
    code, both, out, _ = run([*FLAGS, "--market", "both"], tmp_path, capsys)
    assert code == 0
    chosen = both["chosen"]
    assert chosen["market"] == "spot" and chosen["cost_usd"] < demand["chosen"]["cost_usd"]
    assert chosen["interruptions"] > 0 and chosen["hours"] > chosen["hours_uninterrupted"]
    assert both["market"]["searched"] == ["on-demand", "spot"]
    assert "infra/spot.json" not in both["market"]["spot_table"]["source"]  # names AWS's page
    assert "Spot Instance Advisor" in both["market"]["spot_table"]["source"]
    assert "| market |" not in out and "(spot)" in out and "interruptions" in out


def test_interruptions_that_eat_the_discount_leave_on_demand_chosen(tmp_path, capsys):
    """A 5% discount, 300 interruptions a month and 10 minutes to come back: spot costs more
    in expectation than on-demand, which the table says."""
    eat = ["--market", "both", "--spot-discount", "g4dn.xlarge:0.05,p3.2xlarge:0.05"]
    eat += ["--interruptions", "g4dn.xlarge:300,p3.2xlarge:300", "--restart-s", "600"]
    code, data, out, _ = run([*FLAGS, *eat], tmp_path, capsys)
    assert code == 0 and data["chosen"]["market"] == "on-demand"
    same = [a for a in data["alternatives"] if a["mix"] == data["chosen"]["mix"]]
    assert same and same[0]["market"] == "spot"
    assert same[0]["cost_usd"] > data["chosen"]["cost_usd"]
    assert same[0]["usd_per_hour"] == pytest.approx(0.95 * data["chosen"]["usd_per_hour"])
    assert "overridden for g4dn.xlarge, p3.2xlarge" in data["market"]["spot_table"]["source"]
    ratio = same[0]["cost_usd"] / data["chosen"]["cost_usd"]
    assert f"costs {ratio:.2f}x" in out


def test_a_deadline_met_only_without_interruptions_is_said_so(tmp_path, capsys):
    """One g4dn.xlarge, the deadline a hair over its uninterrupted time: on spot, interrupted
    200 times a month and half an hour lost each time, it is expected late, so on-demand is
    chosen, and the table and a note say that spot would be in time only uninterrupted."""
    one = ["--candidates", "g4dn.xlarge:1", "--global-batch", "128", "--steps", "20000"]
    code, bare, _, _ = run(one, tmp_path, capsys)
    deadline = f"{bare['chosen']['hours'] * 1.001:.6f}"
    late = ["--market", "both", "--interruptions", "g4dn.xlarge:200", "--restart-s", "1800"]
    late += ["--deadline-h", deadline, "--deadline-margin", "0"]
    code, data, out, _ = run([*one, *late], tmp_path, capsys)
    assert code == 0 and data["chosen"]["market"] == "on-demand"
    (spot,) = data["alternatives"]
    assert spot["market"] == "spot" and spot["cost_usd"] < data["chosen"]["cost_usd"]
    assert spot["hours_uninterrupted"] <= float(deadline) < spot["hours"]
    assert "would meet the deadline less its margin only without interruptions" in out
    assert "interruptions (" in out and "h without)" in out  # its row's why it loses
    code, _, _, err = run([*one, *late[:-4], "--market", "spot", *late[-4:]], tmp_path, capsys)
    assert code == 2 and "g4dn.xlarge x1 (spot) would without interruptions" in err


def test_a_chosen_spot_mix_states_its_chance_to_miss_the_deadline(tmp_path, capsys):
    flags = [*FLAGS, "--market", "spot", "--deadline-h", "3", "--interruptions", "g4dn.xlarge:50"]
    code, data, out, _ = run(flags, tmp_path, capsys)
    assert code == 0 and data["chosen"]["market"] == "spot"
    assert "is an expectation" in out and "would pass the 3 h deadline" in out


# -- the table and its overrides --------------------------------------------------------------


def test_a_spot_table_of_ones_own_replaces_the_shipped_one(tmp_path, capsys):
    table = {
        "source": "our own quotes",
        "as_of": "2026-11-27",
        "types": {
            "g4dn.xlarge": {"savings": 0.5, "interruption": 0.0},
            "p3.2xlarge": {"savings": 0.25, "interruption": 0.0},
        },
    }
    path = tmp_path / "spot.json"
    path.write_text(json.dumps(table))
    flags = ["--candidates", "g4dn.xlarge:1", "--global-batch", "128", "--market", "spot"]
    flags += ["--spot-table", str(path)]
    code, data, out, _ = run(flags, tmp_path, capsys)
    assert code == 0 and "our own quotes, as of 2026-11-27" in out
    assert data["chosen"]["usd_per_hour"] == pytest.approx(0.526 * 0.5)
    assert data["chosen"]["interruptions"] == 0
    assert data["chosen"]["hours"] == data["chosen"]["hours_uninterrupted"]
    flags += ["--spot-discount", "g4dn.xlarge:0.75"]
    code, data, _, _ = run(flags, tmp_path, capsys)
    assert data["chosen"]["usd_per_hour"] == pytest.approx(0.526 * 0.25)


def _table(tmp_path, name: str, **types) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"source": "s", "as_of": "d", "types": types}))
    return str(path)


AT_LEAST = "Input should be greater than or equal to"
BAD = [
    (["--market", "spot", "--interruptions", "g4dn.xlarge:-1"], f"--interruptions: {AT_LEAST} 0"),
    (["--market", "spot", "--spot-discount", "g4dn.xlarge:1"], "--spot-discount: Input should"),
    (["--market", "spot", "--interruptions", "g4dn.xlarge:x"], "--interruptions: expected TYPE"),
    (["--market", "spot", "--interruptions", "g5.xlarge:0.1"], "g5.xlarge is not a candidate"),
    (["--market", "spot", "--restart-s", "-5"], f"--restart-s: {AT_LEAST} 0"),
    (["--market", "both", "--checkpoint-every", "0"], f"--checkpoint-every: {AT_LEAST} 1"),
    (["--restart-s", "10"], "--restart-s: only with market spot or both"),
    (["--interruptions", "g4dn.xlarge:0.1"], "--spot-discount/--interruptions: only with market"),
    (["--market", "spot", "--spot-table", "/nonexistent.json"], "cannot read the spot table"),
    (["--market", "spot", "--spot-table", "BAD_TYPE"], "types.g9.xlarge is not in the offline"),
    (["--market", "spot", "--spot-table", "BAD_RATE"], "types.g4dn.xlarge.interruption must"),
    (["--market", "spot", "--spot-table", "BAD_BUCKET"], "is not a bucket of the table"),
    (["--market", "spot", "--spot-table", "NO_P3"], "p3.2xlarge has no spot figures"),
]


@pytest.mark.parametrize("flags, message", BAD, ids=[m[:32] for _, m in BAD])
def test_bad_spot_input_is_one_line(flags, message, tmp_path, capsys):
    tables = {
        "BAD_TYPE": _table(
            tmp_path, "BAD_TYPE", **{"g9.xlarge": {"savings": 0.5, "interruption": 0.1}}
        ),
        "BAD_RATE": _table(
            tmp_path, "BAD_RATE", **{"g4dn.xlarge": {"savings": 0.5, "interruption": -0.1}}
        ),
        "BAD_BUCKET": _table(
            tmp_path, "BAD_BUCKET", **{"g4dn.xlarge": {"savings": 0.5, "interruption": "9%"}}
        ),
        "NO_P3": _table(
            tmp_path, "NO_P3", **{"g4dn.xlarge": {"savings": 0.5, "interruption": 0.1}}
        ),
    }
    flags = [tables.get(f, f) for f in flags]
    code, _, _, err = run([*FLAGS, *flags], tmp_path, capsys)
    assert code == 2
    assert err.startswith("hetflow: error: ") and err.count("\n") == 1, err
    assert message in err


def test_a_budget_is_measured_against_the_cheapest_hour_of_the_markets_searched(tmp_path, capsys):
    """$0.30 is under an on-demand hour of a g4dn.xlarge ($0.526) but over a spot hour."""
    flags = ["--candidates", "g4dn.xlarge:1", "--global-batch", "128", "--steps", "100"]
    flags += ["--budget", "0.3"]
    code, _, _, err = run(flags, tmp_path, capsys)
    assert code == 2 and "less than one instance-hour" in err
    for market in ("spot", "both"):  # with both: on-demand is a hair faster (no interruptions)
        code, data, _, _ = run([*flags, "--market", market], tmp_path, capsys)
        assert code == 0 and data["chosen"]["cost_usd"] <= 0.3
        assert data["chosen"]["market"] == "spot" or market == "both"


def test_a_spot_choice_writes_its_market_into_the_cluster_file_and_the_ray_yaml(tmp_path, capsys):
    """A spot recommendation is launched on spot: the cluster file says so (ClusterSpec reads
    it back) and its Ray launcher YAML asks EC2 for spot worker nodes; on-demand asks for none."""
    import yaml

    from hetflow.config import ClusterSpec

    one = ["--candidates", "g4dn.xlarge:2", "--global-batch", "256", "--steps", "1000"]
    for market in ("spot", "on-demand"):
        code, data, _, _ = run([*one, "--market", market], tmp_path, capsys)
        assert code == 0 and data["chosen"]["market"] == market
        assert ClusterSpec.from_file(tmp_path / "c.yaml").market == market
        ray = yaml.safe_load((tmp_path / "c-ray.yaml").read_text())["available_node_types"]
        options = ray["g4dn_xlarge"]["node_config"].get("InstanceMarketOptions")
        assert options == ({"MarketType": "spot"} if market == "spot" else None)
