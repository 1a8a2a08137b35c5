"""The ranks of one job that are still in it (`ElasticWorld`): a membership agreed through the
job's TCPStore, one gloo group per generation of it, and each step's commit, so that no rank
applies a gradient that not every member has.

Built on `torch.distributed`'s stores and `new_group`, not torchft: torchft's Manager and
Lighthouse keep a quorum of replica groups that each average an equal share, its
ManagedProcessGroup divides by the replicas that took part; hetflow's shares are uneven and
weighted by their counts (`loop.weighting.MeanOverCounts`), re-cut by its own planner when a
worker leaves, and the loop's other collectives (the shared step times, the evaluation's
barrier, the checkpoint's gather) must follow the same membership. A Lighthouse server per job
and a quorum round trip per step would buy nothing the job's store does not give.

Store keys (under `PREFIX`, in the store the launcher hosts, `elastic.launch`):

    deaths, dead/R        the launcher's notice that rank R's process ended (a counter, a flag)
    gen                   the newest generation (the launcher kills live ranks not in it)
    gG/in/R               rank R asks to be in generation G; the value: the step it goes on from
    gG/members            generation G's ranks and leader, JSON ({"ranks", "leader"}); the
                          first rank to decide writes it
    gG/sS/done, /outcome  step S's commit: members with the whole gradient; 'commit' or 'abort'
    gG/leave              'S:R': rank R leaves before step S (`departure.Departures`)
    join/R, asks          rank R's worker is ready and asks to join (its pid); how many asked
    gG/admit              'S:R': generation G's members admit rank R before step S
    worker/R              the worker rank R's newest process runs as (the launcher's)
    departed, departed/I  how many ranks left in place; the I-th one's `RankResult` (JSON)
    lost, lost/I          how many ranks' stretches were rebuilt after a loss; the I-th
                          (`RankResult` JSON, `lost.LostStretches`)
    admit/R               'G:S': rank R is to ask to be in generation G, going on from step S
    over                  the run's last step is done: a joiner still waiting gives up

Each generation's group is named after it (`named_group`), the same in every process, however
many groups a process made before (a joiner made fewer).

A failed collective (gloo raises where a peer's socket closed, or after `timeout_s`) sends its
rank to `regroup`. A gloo rank not next to the lost one in the ring learns of it only from its
own timeout: hence a short one, and a timeout with nobody lost costs a regroup, not a step.
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta

import torch.distributed as dist

PREFIX = "hetflow/elastic"  # a PrefixStore joins it to each key with a "/"
LAZY = "TORCH_GLOO_LAZY_INIT"
JOINING = "HETFLOW_ELASTIC_JOIN"  # set by the launcher on a worker started into a running job


_CURRENT: list = []  # this process's ElasticWorld, once its loop built one


def current() -> ElasticWorld | None:
    """This process's `ElasticWorld` (the newest built), or None outside `on_loss: continue`."""
    return _CURRENT[-1] if _CURRENT else None


class StepAborted(RuntimeError):
    """The step's outcome in the store is 'abort': a member failed or died before every
    member held the whole gradient; no rank applies it."""


class LeftBehind(RuntimeError):
    """This rank asked too late to be in the new generation (it stalled): the others went on
    without it."""


def joins_running_job() -> bool:
    """Whether this process was started into a running job (`JOINING`: a late worker, a
    replacement, one the launcher API added), not at its start."""
    return os.environ.get(JOINING) == "1"


def elastic_group():
    """The current generation's group, or None (the default group) outside `on_loss:
    continue`."""
    w = current()
    return None if w is None else w.group


def open_world(spec, rank: int, world: int) -> ElasticWorld | None:
    """This rank's `ElasticWorld` under `faults.on_loss: continue` (before any collective: a
    late rank's first group is its own), else None."""
    faults = spec.train.faults
    if faults.on_loss != "continue":
        return None
    return ElasticWorld(rank, world, faults.collective_timeout_s)


def result_group(world: int) -> tuple[object, tuple[int, ...], int]:
    """The group the ranks gather their results on, its ranks and the one that writes the
    result: the current generation's and its leader, or the default group over all `world`
    ranks and rank 0."""
    w = current()
    return (None, tuple(range(world)), 0) if w is None else (w.group, w.members, w.leader)


def named_group(ranks: list[int], name: str, timeout: timedelta):
    """A gloo group over `ranks` (global, sorted) named `name` in every process; None where
    this rank is not in it. `new_group(use_local_synchronization=True)` names a group by its
    ranks and the count of groups this process made before, which differs in a process that
    joined late; torch's helper below takes the name. Its ranks connect here (the job's other
    groups connect lazily: `launch.rank_env`), so that a collective on it waits for a peer no
    longer than `timeout`: a lazily connected pair waits for its peer's address as long as
    the store does."""
    from torch.distributed import distributed_c10d as c10d

    rank = dist.get_rank()
    if rank not in ranks:
        return None
    _, store = c10d._world.pg_map[c10d._get_default_group()]
    lazy = os.environ.get(LAZY)
    os.environ[LAZY] = "0"  # connected now, within `timeout`, not at its first collective
    try:
        pg, _ = c10d._new_process_group_helper(
            len(ranks), ranks.index(rank), list(ranks), "gloo", store, name, timeout=timeout
        )
    finally:
        if lazy is None:
            del os.environ[LAZY]
        else:
            os.environ[LAZY] = lazy
    c10d._world.pg_group_ranks[pg] = {g: i for i, g in enumerate(ranks)}
    return pg


def store_client(timeout_s: float = 60.0) -> dist.TCPStore:
    """A client of the job's store (`MASTER_ADDR`, `MASTER_PORT`: the launcher hosts it)."""
    return dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=timedelta(seconds=timeout_s),
    )


class ElasticWorld:
    """This rank's view of the job's membership: `members` (global ranks, sorted) of
    generation `gen`, their `leader`, and `group`, the gloo group over them whose collectives
    time out after `timeout_s`. Every member calls `regroup` after a failure, a leave or an
    admission, and `commit` before each optimizer step; `committed` is the last step this rank
    applied (None: none yet). A rank the launcher started late (not in generation 0's members,
    which the launcher writes) or started into the running job (`JOINING` in its environment:
    a replacement in a slot whose worker left) is `joining`: a member of a group of its own
    until `join`. `worker`: the worker this process runs as, as the launcher wrote it ('':
    none written)."""

    def __init__(self, rank: int, world: int, timeout_s: float, store=None) -> None:
        self.rank, self.world, self.timeout_s = rank, world, timeout_s
        self.store = store if store is not None else dist.PrefixStore(PREFIX, store_client())
        first = tuple(range(world))
        if self.store.check(["g0/members"]):
            first = tuple(json.loads(self.store.get("g0/members"))["ranks"])
        self.joining = rank not in first or os.environ.get(JOINING) == "1"
        self.worker = self.worker_of(rank)
        self.gen, self.members = (-1, (rank,)) if self.joining else (0, first)
        self.leader = self.members[0]
        self.deaths = int(self.store.add("deaths", 0))
        name = f"hetflow-solo-{rank}-{os.getpid()}" if self.joining else "hetflow-g0"
        self.group = self._new_group(name)
        self.committed: int | None = None
        _CURRENT[:] = [self]

    def worker_of(self, rank: int) -> str:
        """The worker rank `rank`'s newest process runs as (`worker/R`), '' where unwritten."""
        key = f"worker/{rank}"
        return self.store.get(key).decode() if self.store.check([key]) else ""

    def _new_group(self, name: str):
        timeout = timedelta(seconds=self.timeout_s)
        return named_group(list(self.members), name, timeout)

    def keep_timeout(self) -> None:
        """The group's collectives time out after `timeout_s` again (`faults.guard` sets every
        group's to the stall timeout once the loop is built)."""
        from torch.distributed.distributed_c10d import _set_pg_timeout

        _set_pg_timeout(timedelta(seconds=self.timeout_s), self.group)

    def commit(self, step: int) -> bool:
        """Whether step `step` is applied, the same answer on every member: 'commit' once every
        member has said it holds the whole gradient (the last to say so decides), 'abort' where
        a member failed (`abort`), died (the launcher's notice) or said nothing for twice the
        collective timeout."""
        key = f"g{self.gen}/s{step}/"
        if int(self.store.add(key + "done", 1)) == len(self.members):
            self.store.compare_set(key + "outcome", "", "commit")
        deadline, delay = time.monotonic() + 2 * self.timeout_s, 0.0005
        while not self.store.check([key + "outcome"]):
            if int(self.store.add("deaths", 0)) > self.deaths or time.monotonic() > deadline:
                self.store.compare_set(key + "outcome", "", "abort")
                break
            time.sleep(delay)
            delay = min(2 * delay, 0.01)
        done = self.store.get(key + "outcome") == b"commit"
        if done:
            self.committed = step
        return done

    def abort(self, step: int) -> None:
        """Step `step` is not applied by any member (a no-op where it was committed)."""
        self.store.compare_set(f"g{self.gen}/s{step}/outcome", "", "abort")

    def regroup(self, next_step: int, admit: tuple[int, ...] = ()) -> tuple[int, ...]:
        """The next generation: the members, and the joiners `admit`, that ask to be in it
        (each going on from `next_step`) within the window, less those the launcher saw die;
        the group over them. Returns the ranks lost. Raises `LeftBehind` where this rank is
        not in it, and a RuntimeError where the members do not agree on the step (a bug:
        commits are all-or-nothing)."""
        g = self.gen + 1
        for r in admit:
            self.store.set(f"admit/{r}", f"{g}:{next_step}")
        self.store.set(f"g{g}/in/{self.rank}", str(next_step))
        before = [m for m in self.members if m not in admit]
        decided = self._decide(g, (*self.members, *admit), before)
        return self._enter(g, decided)

    def join(self, patience_s: float) -> int:
        """This late rank's way in: ask (`join/R`), wait to be admitted (`admit/R`), ask to
        be in that generation and wait for its members, again where they went on without it
        (it asked too late); the step it goes on from. Raises `LeftBehind` where the run ended
        first or no generation took it within `patience_s`."""
        self.store.set(f"join/{self.rank}", str(os.getpid()))
        self.store.add("asks", 1)
        deadline = time.monotonic() + patience_s
        while True:
            g, step = self._admitted(deadline)
            self.store.set(f"g{g}/in/{self.rank}", str(step))
            while not self.store.check([f"g{g}/members"]):
                if time.monotonic() > deadline:
                    raise LeftBehind(f"rank {self.rank}: generation {g} was not decided")
                time.sleep(0.005)
            agreed = json.loads(self.store.get(f"g{g}/members"))
            if self.rank in agreed["ranks"]:
                break
            self.store.delete_key(f"admit/{self.rank}")  # asked too late: ask again
            self.store.add("asks", 1)
        self.members = ()  # none of the last generation's were this rank's
        self._enter(g, agreed)
        self.joining = False
        return step

    def _admitted(self, deadline: float) -> tuple[int, int]:
        """(generation, step) of this joiner's admission, once the members wrote it."""
        while not self.store.check([f"admit/{self.rank}"]):
            if self.store.check(["over"]) or time.monotonic() > deadline:
                raise LeftBehind(f"rank {self.rank}: not admitted to the job")
            time.sleep(0.005)
        g, step = (int(x) for x in self.store.get(f"admit/{self.rank}").decode().split(":"))
        return g, step

    def _enter(self, g: int, agreed: dict) -> tuple[int, ...]:
        """Generation `g` as agreed (`_decide`'s record): this rank's view moved onto it, its
        group made; the ranks lost."""
        decided = agreed["ranks"]
        if self.rank not in decided:
            raise LeftBehind(f"rank {self.rank}: regrouped without it at generation {g}")
        steps = {int(self.store.get(f"g{g}/in/{m}")) for m in decided}
        if len(steps) != 1:
            raise RuntimeError(f"generation {g}: members go on from different steps {steps}")
        lost = tuple(m for m in self.members if m not in decided)
        self.gen, self.members = g, tuple(decided)
        self.leader = agreed["leader"]
        self.deaths = int(self.store.add("deaths", 0))
        if self.rank == self.leader:
            self.store.set("gen", str(g))
        self.group = self._new_group(f"hetflow-g{g}")
        return lost

    def _decide(self, g: int, expected: tuple[int, ...], before: list[int]) -> dict:
        """Generation `g`'s members, as the first rank to know wrote them: once every rank
        `expected` has asked to be in or died, or after the window (twice the collective
        timeout and a second: the slowest member notices the loss by its own timeout), those
        that asked and are alive. Its leader: the old one if it is in, else the lowest of the
        ranks of `before` (the last generation's) in it, never a joiner where one is left."""
        key = f"g{g}/members"
        deadline = time.monotonic() + 2 * self.timeout_s + 1.0
        while not self.store.check([key]):
            asked = [m for m in expected if self.store.check([f"g{g}/in/{m}"])]
            dead = {m for m in expected if self.store.check([f"dead/{m}"])}
            if set(asked) | dead >= set(expected) or time.monotonic() > deadline:
                alive = sorted(m for m in asked if m not in dead)
                stayed = [m for m in before if m in alive] or alive
                leader = self.leader if self.leader in alive else min(stayed, default=-1)
                self.store.compare_set(key, "", json.dumps({"ranks": alive, "leader": leader}))
                break
            time.sleep(0.005)
        return json.loads(self.store.get(key))
