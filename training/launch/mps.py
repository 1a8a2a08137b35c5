"""Workers sharing one GPU by NVIDIA MPS (`WorkerSpec.gpu_share`): several real speeds on one
device, each rank limited to its share of the streaming multiprocessors.

The contract:

- Nothing happens unless some worker sets `gpu_share`; then only the local launcher may run
  the job, on a host with CUDA and `nvidia-cuda-mps-control` on the PATH. Otherwise
  `check_mps` refuses before launch, in one line naming the first such worker's field.
- `mps_daemon` starts a control daemon of the job's own (`nvidia-cuda-mps-control -d`), its
  pipe and log folders under a fresh temporary folder, so that it neither meets nor stops a
  daemon someone else runs; it yields the environment the ranks inherit (the pipe and log
  folders) and, on the way out whatever happened, sends `quit` to that daemon with the same
  environment and removes the folder. It never changes the GPU's compute mode: in the
  default mode MPS clients and other processes share the device.
- Every CUDA rank of such a job is an MPS client. Each rank sets its own share
  (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, from `rank_env`) in its environment before its first
  CUDA call (`apply_rank_env`); a rank whose worker sets no share runs with all of them.

The commands and environments are built by pure functions (`daemon_env`, `START`, `QUIT`),
so what runs can be read and tested without a GPU.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from hetflow.config import ClusterSpec, ConfigError

CONTROL = "nvidia-cuda-mps-control"
START = [CONTROL, "-d"]  # the control daemon, in the background
QUIT = [CONTROL]  # with "quit" on its standard input: the daemon and its server stop
SHARE_VAR = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
PIPE_VAR = "CUDA_MPS_PIPE_DIRECTORY"
LOG_VAR = "CUDA_MPS_LOG_DIRECTORY"


class MpsError(RuntimeError):
    """The MPS control daemon did not start or stop; the message is one line."""


def shared(cluster: ClusterSpec) -> list[str]:
    """The names of the workers that set `gpu_share`, in rank order (pure)."""
    return [w.name for w in cluster.workers if w.gpu_share is not None]


def check_mps(cluster: ClusterSpec, cuda_available: bool, control: str | None) -> None:
    """Refuse, before launch, a job whose workers set `gpu_share` where MPS cannot run it: a
    one-line ConfigError naming the first such worker's field (pure: the caller passes whether
    CUDA is there and where `nvidia-cuda-mps-control` is, `mps_available()`)."""
    names = shared(cluster)
    if not names:
        return
    field = f"cluster.workers[{names[0]}].gpu_share"
    if cluster.launcher != "local":
        raise ConfigError(f"{field}: MPS shares need the local launcher (got {cluster.launcher!r})")
    if control is None:
        raise ConfigError(f"{field}: MPS is not available here ({CONTROL} not found)")
    if not cuda_available:
        raise ConfigError(f"{field}: MPS is not available here (no CUDA device)")


def mps_available() -> tuple[bool, str | None]:
    """(whether torch sees a CUDA device, the path of `nvidia-cuda-mps-control` or None)."""
    import torch

    return torch.cuda.is_available(), shutil.which(CONTROL)


def daemon_env(root: str | Path, base: dict[str, str]) -> dict[str, str]:
    """`base` with the daemon's pipe and log folders under `root` (pure): what the daemon, its
    `quit` and every rank run with."""
    return {**base, PIPE_VAR: str(Path(root) / "pipe"), LOG_VAR: str(Path(root) / "log")}


def rank_env(cluster: ClusterSpec, rank: int) -> dict[str, str]:
    """The variables rank `rank` sets for itself (pure): its share, where its worker has one.

    >>> from hetflow.config import WorkerSpec
    >>> c = ClusterSpec(workers=[WorkerSpec(name="a", gpu_share=10), WorkerSpec(name="b")])
    >>> rank_env(c, 0), rank_env(c, 1)
    ({'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE': '10'}, {})
    """
    share = cluster.workers[rank].gpu_share
    return {} if share is None else {SHARE_VAR: str(share)}


def apply_rank_env(cluster: ClusterSpec, rank: int) -> None:
    """This process's share of its GPU, where its worker sets one. Call it before the first
    CUDA call: the driver reads the share when the process's CUDA context is made."""
    os.environ.update(rank_env(cluster, rank))


@contextlib.contextmanager
def mps_daemon(cluster: ClusterSpec, base: dict[str, str]) -> Iterator[dict[str, str]]:
    """Where some worker sets `gpu_share`: a control daemon of this job's own for the block,
    yielding `base` plus its pipe and log folders (the ranks' environment); else `base`
    unchanged, and nothing started. The daemon is told to quit and its folder removed on the
    way out, whatever happened in the block."""
    if not shared(cluster):
        yield base
        return
    with tempfile.TemporaryDirectory(prefix="hetflow-mps-") as root:
        env = daemon_env(root, base)
        for var in (PIPE_VAR, LOG_VAR):
            Path(env[var]).mkdir()
        _control(START, env, None, "start")
        try:
            yield env
        except BaseException:
            # stopped all the same; the block's own error is the one to report
            with contextlib.suppress(MpsError, OSError, subprocess.SubprocessError):
                _control(QUIT, env, "quit\n", "stop")
            raise
        _control(QUIT, env, "quit\n", "stop")


def _control(cmd: list[str], env: dict[str, str], stdin: str | None, what: str) -> None:
    """Run one `nvidia-cuda-mps-control` command; MpsError in one line where it fails."""
    done = subprocess.run(cmd, env=env, input=stdin, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise MpsError(
            f"{CONTROL}: could not {what} the MPS daemon (exit {done.returncode}"
            + (f": {said[-1]})" if said else ")")
        )
