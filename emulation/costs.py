"""The host's CPU time of each keyed compute phase, shared by the emulated ranks of one job."""

from __future__ import annotations

import os
import struct
from collections import defaultdict, deque
from pathlib import Path

# A keyed compute phase is dilated from the least CPU time of each rank's last SMOOTH_PHASES
# phases of its key (see `hetflow.emulation.emulator.Emulator`).
SMOOTH_PHASES = 7

_RECORD = struct.Struct("<id")  # (rank, CPU seconds): 12 bytes, one os.write with O_APPEND


class LocalCosts:
    """`SharedCosts` for one process alone: the least of a key's last `keep` phases here (a
    rank with no table to share: a GPU's phases, the emulator's own tests)."""

    def __init__(self, keep: int = SMOOTH_PHASES) -> None:
        self._recent: dict[object, deque[float]] = defaultdict(lambda: deque(maxlen=keep))

    def add(self, key: object, cpu_s: float) -> float:
        self._recent[key].append(cpu_s)
        return min(self._recent[key])

    def settled(self, key: object) -> float | None:
        recent = self._recent.get(key)
        return min(recent) if recent else None

    def forget(self) -> None:
        self._recent.clear()


class SharedCosts:
    """What one compute phase of a key (a batch size) costs this host, as the least CPU time of
    the last `keep` phases of that key of every rank of the job on this host.

    Emulated workers differ by their slowdown alone: at the same batch they do the same work,
    so the host's cost of it is one figure for all of them. Measured per process, it is not:
    the same step's least CPU time moves between processes and over seconds, so workers of one
    speed would profile apart and a balanced plan would compute unevenly (the figures, before
    and after sharing: docs/measurements/emulation.md, 'The ranks share the host's cost of a
    batch'). Shared, the noise that is left moves every worker alike, which a plan in
    proportion to speed does not feel. Each rank appends its phases to one small file per key
    under `folder` (one 12-byte write with O_APPEND, so concurrent ranks do not interleave)
    and reads the file's tail through the same descriptor: no lock, no server; an `add` costs
    microseconds, small against a step (measured, with the command: the same page). Written
    for the emulator: torch.distributed has no host-local shared table, and a collective per
    step would add a synchronization that a real device does not have.

    `forget` starts a new generation of keys (every rank calls it at the same point: the
    compression trials' timed steps, which must be dilated from their own costs alone).
    """

    def __init__(self, folder: str | Path, rank: int, world: int, keep: int = SMOOTH_PHASES):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.rank, self.world, self.keep = rank, world, keep
        self.generation = 0

    def _path(self, key: object) -> Path:
        return self.folder / f"{self.generation}-{key}"

    def add(self, key: object, cpu_s: float) -> float:
        """Record that this rank's phase of `key` took `cpu_s` CPU seconds; the key's settled
        cost (`settled`), this phase included."""
        fd = os.open(self._path(key), os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, _RECORD.pack(self.rank, cpu_s))
            return self._least_in(fd)
        finally:
            os.close(fd)

    def settled(self, key: object) -> float | None:
        """The least CPU time of each rank's last `keep` phases of `key`, among the key's last
        `world` x `keep` phases on this host (None before any)."""
        try:
            fd = os.open(self._path(key), os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            return self._least_in(fd)
        finally:
            os.close(fd)

    def _least_in(self, fd: int) -> float | None:
        size = os.fstat(fd).st_size
        whole = size - size % _RECORD.size  # a record still being written is skipped
        tail = min(whole, self.world * self.keep * _RECORD.size)
        recent: dict[int, list[float]] = {}
        for rank, cpu in _RECORD.iter_unpack(os.pread(fd, tail, whole - tail)):
            recent.setdefault(rank, []).append(cpu)
        return min((t for times in recent.values() for t in times[-self.keep :]), default=None)

    def forget(self) -> None:
        """Start a new generation: the next phases are dilated from their own costs alone."""
        self.generation += 1
