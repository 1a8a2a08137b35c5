"""The torchrun entry point: one process per (emulated) worker, DDP over gloo (NCCL when every
rank has a GPU of its own), each rank on its worker's device (`training.devices`).

One machine, 4 emulated workers (what `hetflow demo` runs)::

    torchrun --nproc-per-node 4 -m hetflow.training.worker --job RUN_DIR/job.json

Several nodes (c10d rendezvous; run the same line on every node)::

    torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d \\
        --rdzv-endpoint HOST:29400 --rdzv-id JOB -m hetflow.training.worker --job job.json

Rank 0 writes `result.json` (and `model.pt`) into the job's run directory.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from datetime import timedelta
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from hetflow.infra.data.reader import open_rank_data, peak_rss_bytes
from hetflow.infra.s3 import filesystem
from hetflow.records import RankResult, RunResult
from hetflow.training.comm import WireCounter
from hetflow.training.cores import host_cores, pin_rank
from hetflow.training.cpu_quota import join_quota, own_quota
from hetflow.training.devices import MixedPrecision, rank_device_precision, synchronizer
from hetflow.training.elastic.departure import departed_results
from hetflow.training.elastic.lost import lost_results
from hetflow.training.elastic.world import open_world, result_group
from hetflow.training.faults.records import (
    PREEMPTED_EXIT,
    STARTUP_TIMEOUT_S,
    Preempted,
    write_failure,
    write_pid,
)
from hetflow.training.faults.watch import dump_on_signal
from hetflow.training.launch.mps import apply_rank_env
from hetflow.training.launch.ready import launch_ready
from hetflow.training.launch.spec import RunSpec, emulator_for
from hetflow.training.launch.startup import StartupMarks
from hetflow.training.loop.training_loop import train
from hetflow.training.probes import profile
from hetflow.training.rank import RankContext
from hetflow.training.recipes import recipe_of


def init_process_group(timeout: timedelta, backend: str = "gloo") -> None:
    """`backend` (gloo, or NCCL when every rank has a CUDA device of its own) over torchrun's
    store, in a namespace of its own for each elastic restart; a collective waits at most
    `timeout`.

    torchrun hands the restarted workers the same agent store; without a fresh prefix they
    read the previous round's gloo addresses and fail with 'connection refused'.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group(backend, timeout=timeout)
        return
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    base = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=timedelta(minutes=5),
    )
    store = dist.PrefixStore(f"hetflow/attempt_{attempt}/", base)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)


def write_result(
    run_dir: Path,
    mode: str,
    ranks: list,
    weights: dict | None,
    state_url: str | None = None,
    departed: list[str] | None = None,
    lost: list[str] | None = None,
) -> None:
    """Rank 0's output: model.pt (the trained weights, if any), and result.json written whole
    (under a temporary name, then renamed), both also put at `state_url` if given:
    `RunResult`'s JSON for a training run (`ranks`: every rank's `RankResult`; `departed`
    and `lost`: the JSON of those that left in place and of those lost there),
    `{"mode": "profile", "ranks": [...]}` for a profile."""
    if weights is not None:
        torch.save(weights, run_dir / "model.pt")
    if mode == "train":
        left = [RankResult.model_validate_json(t) for t in departed or []]
        gone = [RankResult.model_validate_json(t) for t in lost or []]
        text = RunResult(ranks=ranks, departed=left, lost=gone).model_dump_json()
    else:
        text = json.dumps({"mode": mode, "ranks": ranks})
    tmp = run_dir / "result.json.tmp"
    tmp.write_text(text)
    tmp.replace(run_dir / "result.json")
    if state_url:  # for a driver on another host: model first, result.json (the marker) last
        for name in ("model.pt", "result.json"):
            if (run_dir / name).exists():
                fs, path = filesystem(f"{state_url}/{name}")
                fs.put_file(str(run_dir / name), path)


@record  # torchrun's error file: its summary in workers.log names the rank and exception
def main(argv: list[str] | None = None) -> None:
    """Run the job (`start`). Once it is done, the process exits at once (`os._exit(0)`),
    without the interpreter's teardown."""
    _start_or_exit(argv)
    # Done and written: leave without the interpreter's teardown. There, once in a full test
    # run on the loaded 2-core host, a C++ thread left joinable aborted a rank whose run was
    # over ("terminate called without an active exception"), and torchrun failed the job.
    _exit_now(0)


def _start_or_exit(argv: list[str] | None) -> None:
    """`start`; where it ends on `SystemExit` (preempted, its checkpoint written: the code
    tells the launcher to restart), the process ends there at once with that code."""
    try:
        start(argv)
    except SystemExit as e:
        _exit_now(e.code if isinstance(e.code, int) else 1)


def _exit_now(code: int) -> None:
    """End this process with `code` at once, its output flushed: no interpreter teardown,
    which joins every thread left (a data thread stuck on a read that never answers, an
    S3 request on a loaded host, would hold the rank, and its job, past any deadline)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def forked_main(*argv: str) -> None:
    """The entry of a rank forked from a warm agent (`launch.warm`): `start`, then return, for
    torchrun's agent to collect the rank's return (the fork's process then ends without the
    interpreter's teardown: multiprocessing's `os._exit`). The fork inherits the agent's
    handlers for SIGTERM, SIGINT, SIGHUP and SIGQUIT (torchelastic's, which raise its
    `SignalException`): they are put back to a fresh interpreter's first, so a rank answers
    a signal as one torchrun started would (the rank's own SIGTERM handler comes later).
    Preempted (`SystemExit`), it ends at once with its code, as `main` does: multiprocessing
    would join its threads first. It starts once every rank of its round is forked
    (`await_siblings`)."""
    default_signals()
    await_siblings(list(argv))
    _start_or_exit(list(argv))


SIBLINGS_WAIT_S = 60.0  # how long a forked rank waits for its siblings to be forked


def await_siblings(argv: list[str], timeout_s: float = SIBLINGS_WAIT_S) -> None:
    """Hold a rank forked from the agent until every rank of its round is forked (at most
    `timeout_s`): each touches a file named by its local rank in a folder of its agent and
    restart round, beside the job file (`--job` in `argv`; else in the temporary folder),
    and waits for LOCAL_WORLD_SIZE of them. A fork copies one thread, and whatever lock
    another thread held at that moment stays held in the child: a rank hung in its own
    store connect on glibc's resolver lock (in `getnameinfo`), and its job with it, most
    likely taken by the agent's store thread resolving a sibling that was connecting. Once
    every rank is forked, none is forked while another connects."""
    world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if world <= 1:
        return
    job = argv[argv.index("--job") + 1] if "--job" in argv[:-1] else None
    base = Path(job).parent if job else Path(tempfile.gettempdir())
    round_ = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    folder = base / "forks" / f"{os.getppid()}-{round_}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / os.environ.get("LOCAL_RANK", str(os.getpid()))).touch()
    deadline = time.monotonic() + timeout_s
    while sum(1 for _ in folder.iterdir()) < world and time.monotonic() < deadline:
        time.sleep(0.005)


def default_signals() -> None:
    """A fresh interpreter's signal handlers: KeyboardInterrupt on SIGINT, the system's
    default for SIGTERM, SIGHUP and SIGQUIT."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)


def start(argv: list[str] | None = None) -> None:
    """Run the job on this rank; on an exception, write this rank's `RankFailure` first (the
    launcher ends the job on it), and after a SIGTERM's checkpoint exit with PREEMPTED_EXIT.
    The start-up's phases are marked as they end (`startup.StartupMarks`). Asked by the
    launcher (`faults.watch.dump_stacks`), the rank writes its threads' stacks to its log."""
    dump_on_signal()
    marks = StartupMarks()
    marks.mark("import")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", required=True, help="job.json written by the flow")
    args = parser.parse_args(argv)
    spec = RunSpec.read(args.job)
    rank = int(os.environ.get("RANK", "0"))
    device, precision = place_rank(spec, rank, int(os.environ.get("LOCAL_RANK", str(rank))))
    timeout = timedelta(seconds=max(STARTUP_TIMEOUT_S, spec.train.stall_timeout_s))
    init_process_group(timeout, spec.backend)
    marks.mark("rendezvous")
    serve_rank(spec, rank, device, precision, "torchrun", marks)
    dist.destroy_process_group()


def place_rank(spec: RunSpec, rank: int, local_rank: int) -> tuple[str, str]:
    """This rank's torch threads, device (made current) and precision, before its process group
    exists (NCCL needs the device first)."""
    torch.set_num_threads(spec.train.threads_per_rank)
    pin_rank(spec.cluster, rank)  # a worker's own cores and threads, where it sets `cpus`
    join_quota(spec.cluster, rank, spec.run_name)  # its cgroup, where it sets `cpu_quota`
    apply_rank_env(spec.cluster, rank)  # its MPS share, where it sets `gpu_share`
    device, precision = rank_device_precision(
        spec.cluster, spec.train, rank, local_rank, spec.backend
    )
    if device != "cpu":
        torch.cuda.set_device(device)
    return device, precision


def serve_rank(
    spec: RunSpec,
    rank: int,
    device: str,
    precision: str,
    restarter: str,
    marks: StartupMarks | None = None,
) -> None:
    """`run` in a process group that exists (torchrun's or Ray Train's); on an exception, this
    rank's `RankFailure` first, and after a SIGTERM's checkpoint exit with PREEMPTED_EXIT for
    `restarter` to restart the group. `marks`: the start-up's, where the launcher marks it."""
    write_pid(spec.run_dir, rank)
    try:
        run(spec, rank, device, precision, marks)
    except Preempted as e:
        dist.destroy_process_group()
        print(f"rank {rank}: {e}; exiting for {restarter}'s restart", flush=True)
        raise SystemExit(PREEMPTED_EXIT) from None
    except BaseException as e:  # no clean-up: the process ends, and with it its sockets
        if not (isinstance(e, SystemExit) and not e.code):
            write_failure(spec.run_dir, rank, e)
        raise


def run(
    spec: RunSpec,
    rank: int,
    device: str = "cpu",
    precision: str = "fp32",
    marks: StartupMarks | None = None,
) -> None:
    """Train or profile on this rank, on `device` in `precision` (every rank scales its loss
    when any computes in fp16); rank 0 writes the result, a training rank's with its
    start-up by phase where `marks` has them. The spec's train config is run as the
    launcher carried it, resolved; a job file written by hand is resolved here first
    (`launch_ready`, which resolves nothing in a carried one)."""
    spec = launch_ready(spec)

    world = dist.get_world_size()
    if world != spec.cluster.world_size:
        raise SystemExit(f"world size {world} != {spec.cluster.world_size} workers in the cluster")
    open_world(spec, rank, world)  # under `on_loss: continue`: the ranks that start the job
    group, members, _ = result_group(world)
    precisions: list = [None] * len(members)
    dist.all_gather_object(precisions, precision, group=group)
    amp = MixedPrecision(device, precision, scaled="fp16" in precisions)
    counter = WireCounter(world)
    counter.install()
    try:
        start_rss = peak_rss_bytes()  # the process's fixed part: torch, the process group
        # reads no shard: each rank streams its own (token windows of the recipe's context)
        recipe = recipe_of(spec.train)  # once: the loop and the probes take it from `ctx`
        data = open_rank_data(spec.dataset, context=recipe.context, manifest=spec.manifest)
        if marks is not None:
            marks.mark("data")
        emu, clocks = install_clocks(spec, rank, amp, counter)
        ctx = RankContext(spec, rank, world, data, amp, counter, emu, clocks, marks, recipe)
        if spec.mode == "train":
            mine, weights = train(ctx)
            if marks is not None and spec.submitted_at:
                line = mine.timeline
                line.startup = marks.phases(spec.submitted_at, line.first_step_s, line.trials_s)
            mine.start_rss_bytes = start_rss
            mine.cores = host_cores()
            mine.cpu_quota = own_quota()
        else:
            mine = profile(ctx).model_dump(mode="json")
            weights = None
        data.close()
        # the ranks still in the job (`training.elastic`)
        group, members, writer = result_group(world)
        gathered: list = [None] * len(members)
        dist.all_gather_object(gathered, mine, group=group)
        if rank == writer:  # rank 0, or where it was lost, the rank that took its part
            trained = spec.mode == "train"
            left, lost = (departed_results(), lost_results()) if trained else ([], [])
            ours = gathered.pop(members.index(writer))  # first: `RunResult.lead`
            out = [ours, *gathered]
            write_result(Path(spec.run_dir), spec.mode, out, weights, spec.state_url, left, lost)
    finally:
        counter.uninstall()


def install_clocks(spec: RunSpec, rank: int, amp: MixedPrecision, counter: WireCounter):
    """The compute-phase clocks the worker installs (`training.hooks`): for a training run,
    the training's emulator (`emulator_for`), built once, its link attached to the wire
    `counter` so that from here on (the compression trials too) each collective over the
    network costs the link's time; and the factory of a fresh one per scope (a trial's, the
    profile's). A profile gets the factory alone: its probes take their own clock, and no link
    is attached to the counter (the network probe times the link itself)."""
    clocks = partial(emulator_for, spec, rank, synchronizer(amp.device))
    if spec.mode != "train":
        return None, clocks
    emu = clocks("train")
    counter.link = emu.link
    return emu, clocks


if __name__ == "__main__":
    main()
