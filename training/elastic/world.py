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
    gG/members            generation G's ranks, JSON; the first rank to decide writes it
    gG/sS/done, /outcome  step S's commit: members with the whole gradient; 'commit' or 'abort'

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


def result_group(world: int) -> tuple[object, tuple[int, ...]]:
    """The group the ranks gather their results on, and its ranks: the current generation's,
    or the default group over all `world` ranks."""
    w = current()
    return (None, tuple(range(world))) if w is None else (w.group, w.members)


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
    generation `gen`, and `group`, the gloo group over them whose collectives time out after
    `timeout_s`. Every member calls `regroup` after a failure and `commit` before each
    optimizer step; `committed` is the last step this rank applied (None: none yet)."""

    def __init__(self, rank: int, world: int, timeout_s: float, store=None) -> None:
        self.rank, self.timeout_s = rank, timeout_s
        self.store = store if store is not None else dist.PrefixStore(PREFIX, store_client())
        self.gen, self.members = 0, tuple(range(world))
        self.deaths = int(self.store.add("deaths", 0))
        self.group = self._new_group()
        self.committed: int | None = None
        _CURRENT[:] = [self]

    @property
    def leader(self) -> int:
        return self.members[0]

    def _new_group(self):
        timeout = timedelta(seconds=self.timeout_s)
        return dist.new_group(list(self.members), timeout=timeout, use_local_synchronization=True)

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

    def regroup(self, next_step: int) -> tuple[int, ...]:
        """The next generation: the members that ask to be in it (each going on from
        `next_step`) within the window, less those the launcher saw die; the group over them.
        Returns the ranks lost. Raises `LeftBehind` where this rank is not in it, and a
        RuntimeError where the members do not agree on the step (a bug: commits are
        all-or-nothing)."""
        g = self.gen + 1
        self.store.set(f"g{g}/in/{self.rank}", str(next_step))
        decided = self._decide(g)
        if self.rank not in decided:
            raise LeftBehind(f"rank {self.rank}: regrouped without it at generation {g}")
        steps = {int(self.store.get(f"g{g}/in/{m}")) for m in decided}
        if len(steps) != 1:
            raise RuntimeError(f"generation {g}: members go on from different steps {steps}")
        lost = tuple(m for m in self.members if m not in decided)
        self.gen, self.members = g, tuple(decided)
        self.deaths = int(self.store.add("deaths", 0))
        if self.rank == self.leader:
            self.store.set("gen", str(g))
        self.group = self._new_group()
        return lost

    def _decide(self, g: int) -> list[int]:
        """Generation `g`'s members, as the first rank to know wrote them: once every member
        has asked to be in or died, or after the window (twice the collective timeout and a
        second: the slowest member notices the loss by its own timeout), those that asked and
        are alive."""
        key = f"g{g}/members"
        deadline = time.monotonic() + 2 * self.timeout_s + 1.0
        while not self.store.check([key]):
            asked = [m for m in self.members if self.store.check([f"g{g}/in/{m}"])]
            dead = {m for m in self.members if self.store.check([f"dead/{m}"])}
            if set(asked) | dead >= set(self.members) or time.monotonic() > deadline:
                alive = [m for m in asked if m not in dead]
                self.store.compare_set(key, "", json.dumps(alive))
                break
            time.sleep(0.005)
        return json.loads(self.store.get(key))
