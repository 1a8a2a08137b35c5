"""A worker that gets SIGTERM under `faults.on_loss: continue` (a spot notice, the queue
taking it back) leaves the job at a step boundary every rank agrees on, and only it: the
others regroup without it at once, no failed collective, no timeout, no checkpoint."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable

from hetflow.training.elastic.world import ElasticWorld, current


class Departures:
    """This rank's side of the planned leaves of `world`'s members.

    The rank that got SIGTERM writes, at its next boundary b, `gG/leave` = 'b+1:rank' into the
    store (first writer wins; a second signalled rank asks again in the next generation);
    every rank reads that key at each boundary (one round trip) and, at b+1, the leaver ends
    its process (marking itself dead, so that no one waits for it) while the others regroup.
    b+1 is the same boundary for all: no rank can finish step b before the leaver, at
    boundary b, has written and joined step b's all-reduce (`faults.guard.Preemption`'s
    argument). The handler replaces `Preemption`'s, which would stop every rank.

    Before it ends, the leaver leaves its result (`publish`: its `RankResult`'s JSON, the
    steps it ran) in the store (`world.PREFIX` `departed/I`), where the rank that writes the
    run's result finds it (`departed_results`): the run keeps what its steps measured."""

    def __init__(self, world: ElasticWorld, publish: Callable[[], str] | None = None) -> None:
        self.world, self.publish = world, publish
        self.signalled = self.asked = False
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame) -> None:
        self.signalled = True
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second one kills at once

    def leaving(self, step: int) -> int | None:
        """Before step `step`: the rank that leaves here, if one does (this process ends here
        if it is that rank)."""
        w = self.world
        key = f"g{w.gen}/leave"
        if self.signalled and not self.asked:
            self.asked = True
            w.store.compare_set(key, "", f"{step + 1}:{w.rank}")
        if not w.store.check([key]):
            return None
        at, who = (int(x) for x in w.store.get(key).decode().split(":"))
        if step < at:
            return None
        if who == w.rank:
            print(f"rank {w.rank}: leaving the job before step {step} (SIGTERM)", flush=True)
            self.leave_result()
            if tuple(w.members) == (w.rank,):  # the last member: no one left to admit a joiner
                w.store.set("over", "1")
            w.store.set(f"dead/{w.rank}", "1")
            sys.stdout.flush()
            os._exit(0)
        self.asked = False  # another rank's leave: a signalled one asks in the next generation
        return who

    def leave_result(self) -> None:
        """This leaver's result in the store (`departed/I`, I counted by `departed`); a
        result that cannot be made is said, and the leave goes on without it."""
        if self.publish is None:
            return
        try:
            text = self.publish()
        except Exception as e:  # the leave must not fail for its record
            print(f"rank {self.world.rank}: its result is not kept ({e!r})", flush=True)
            return
        store_result(self.world.store, "departed", text)


def store_result(store, name: str, text: str) -> None:
    """`text` (a `RankResult`'s JSON) kept in the job's `store` as `name/I`, I counted by
    `name`: `departed` (a leaver's own), `lost` (a lost rank's, rebuilt: `elastic.lost`)."""
    i = int(store.add(name, 1)) - 1
    store.set(f"{name}/{i}", text)


def departed_results(store=None) -> list[str]:
    """The results (JSON) the ranks that left in place left in the job's `store` (a
    `world.PREFIX` one; by default this process's `ElasticWorld`'s), in the order they
    left; none outside `on_loss: continue`."""
    return stored_results("departed", store)


def stored_results(name: str, store=None) -> list[str]:
    """The results (JSON) kept as `name/I` in `store` (`store_result`; by default this
    process's `ElasticWorld`'s), in the order they were kept; none outside `on_loss:
    continue`."""
    if store is None:
        w = current()
        if w is None:
            return []
        store = w.store
    count = int(store.add(name, 0))
    return [store.get(f"{name}/{i}").decode() for i in range(count)]
