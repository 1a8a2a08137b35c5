"""`hetflow bench hetero`'s flags (their checks are `hetero.parse_args`' and, for each
worker's hardware, `hetero.hardware`')."""

from __future__ import annotations

import argparse

from hetflow.cli.args import Parser, add_recipe_arg, add_strategy_arg, choices
from hetflow.config import BUILTIN_RECIPES, ClusterSpec, TrainConfig
from hetflow.emulation.device_model import NOISE_LEVELS

PRECISION = TrainConfig.model_fields["precision"]
TIME_SCALE = 16.0  # see hetero's docstring
VARIANTS = ("baseline", "static", "dynamic")


def parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="hetflow bench hetero",
        description="equal split vs static plan vs dynamic re-balancing, in one run",
        formatter_class=argparse.HelpFormatter,  # its help states the defaults itself
    )
    p.add_argument(
        "--speeds",
        help="relative speeds, or device presets (t4, v100, a100), comma-separated "
        "(default: 1,1,2,4; with --cpu-quotas, one worker of each quota)",
    )
    p.add_argument("--steps", type=int, default=150)
    add_recipe_arg(p, "digits-cnn", BUILTIN_RECIPES)
    add_strategy_arg(p, choices(TrainConfig, "strategy"), TrainConfig().strategy)
    p.add_argument("--global-batch", type=int, default=128, dest="global_batch")
    p.add_argument(
        "--straggler",
        action="append",
        default=[],
        help="RANK:STEP:FACTOR[:RAMP]: from STEP on, worker RANK computes FACTOR times slower, "
        "reached over RAMP steps (default 0: at once); repeatable",
    )
    p.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="comma-separated: baseline (equal split), static (planned from the profile, "
        "which it is charged), dynamic (from a prior, learned from its own steps; "
        "dynamic@profile: from the profile, charged), and fastest (the fastest worker alone "
        "with the whole batch, the others not launched: what dropping the slow workers "
        "gives); static@history: static as a second run plans it, from the profile history "
        "(this invocation's profile as its entries), charged no profile; VARIANT@micro runs it "
        "with train.accumulate 'auto' (shares past a memory cap "
        f"as micro-batches) (default: {','.join(VARIANTS)})",
    )
    p.add_argument(
        "--memory-caps",
        dest="memory_caps",
        help="each worker's declared memory cap (its largest batch in one pass), "
        "comma-separated, empty for none: e.g. ,,,16 (default: none)",
    )
    p.add_argument(
        "--rebalance-every",
        type=int,
        default=TrainConfig.model_fields["rebalance_every"].default,
        dest="rebalance_every",
        help="dynamic: check the balance every K steps",
    )
    p.add_argument(
        "--rebalance-threshold",
        type=float,
        dest="rebalance_threshold",
        default=TrainConfig.model_fields["rebalance_threshold"].default,
        help="dynamic: imbalance (max/mean - 1) that triggers a re-plan",
    )
    _add_emulation_and_launch(p)
    _add_hardware(p)
    return p


def _add_emulation_and_launch(p: argparse.ArgumentParser) -> None:
    """The emulation's time scale and noise, the rounds, the launcher and the bound."""
    p.add_argument(
        "--time-scale",
        type=float,
        dest="time_scale",
        default=TIME_SCALE,
        help="emulation: the fastest worker runs this many times slower than a core "
        f"(default {TIME_SCALE:g})",
    )
    _add_noise(p)
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every variant N times, round by round, and report each one's median run",
    )
    p.add_argument(
        "--launcher",
        choices=("local", "ray"),
        default="local",
        help="ray: also run every variant on Ray Train (named VARIANT@ray), beside torchrun",
    )
    p.add_argument(
        "--ray-address",
        dest="ray_address",
        help="with --launcher ray: an existing Ray cluster (default: a local one, one node per "
        "worker, started for the bench)",
    )
    p.add_argument(
        "--bound",
        action="store_true",
        help="after each round, time every worker alone at the batches the plans gave it: "
        "the bound each variant is graded against, measured, not modelled (efficiency_vs_bound)",
    )
    _add_output(p)


def _add_noise(p: argparse.ArgumentParser) -> None:
    """How far the emulated devices stray from a line: their noise and their curves."""
    p.add_argument(
        "--noise",
        default=ClusterSpec.model_fields["noise"].default,
        help=f"emulation: step-time noise level, one of {', '.join(NOISE_LEVELS)}, each "
        "measured (`hetflow bench noise`; 'shared': slow stretches of several steps) "
        f"(default: {ClusterSpec.model_fields['noise'].default})",
    )
    p.add_argument(
        "--curve",
        choices=("host", "published"),
        default="host",
        help="emulation: a worker of a speed alone follows the host's curve times its speed, "
        "or the published curve of a device of that speed (default: host)",
    )
    p.add_argument(
        "--jitter",
        type=float,
        help="emulation: coefficient of variation of every compute step's time (default: the "
        "--noise level's)",
    )
    p.add_argument(
        "--pauses",
        type=float,
        help="emulation: probability that a compute step lasts 2.3x its time (default: the "
        "--noise level's)",
    )


def _add_output(p: argparse.ArgumentParser) -> None:
    """Where the figures go: the JSON, the rate plot, each run's records."""
    p.add_argument("--json", dest="json_path")
    p.add_argument(
        "--plot",
        metavar="PNG",
        help="each variant's samples/s against steps (its median run's), one line a variant",
    )
    p.add_argument(
        "--keep-results",
        dest="keep_results",
        metavar="DIR",
        help="write each run's result.json (every rank's step records) and first plan to "
        "DIR/VARIANT-ROUND.json",
    )


def _add_hardware(p: argparse.ArgumentParser) -> None:
    """Each worker's cores, device and precision, and whether its speed is emulated."""
    p.add_argument(
        "--cpus",
        help="each worker's own CPU cores, comma-separated (e.g. 1,2,4,8): its process pinned "
        "to them, with as many torch threads; with --no-emulate, real mixed speeds",
    )
    p.add_argument(
        "--cpu-quotas",
        dest="cpu_quotas",
        help="each worker's share of the CPU in cores, comma-separated (e.g. 1,0.5,0.25,0.25), "
        "enforced by the kernel in a cgroup per worker (root, cgroup v1 or v2): real unequal "
        "workers, so no time dilation (implies --no-emulate); the workers' count is theirs",
    )
    p.add_argument(
        "--gpu-shares",
        dest="gpu_shares",
        help="each worker's share of its GPU in percent, comma-separated, empty for none (e.g. "
        "10,20,30,40): the job runs beside an MPS daemon of its own (`gpu_share`)",
    )
    p.add_argument(
        "--devices",
        help="each worker's device, comma-separated (auto, cuda, cpu), or one for all "
        "(default: auto)",
    )
    p.add_argument(
        "--precision",
        default=PRECISION.default,
        help="the autocast precision, or several comma-separated (fp32,auto): every variant "
        "then runs in each (named VARIANT@PRECISION)",
    )
    p.add_argument(
        "--no-emulate",
        dest="emulate",
        action="store_false",
        help="real heterogeneity (e.g. one CUDA worker beside CPU workers): no time dilation",
    )
