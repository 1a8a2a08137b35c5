"""A worker that asks to join a running job under `faults.on_loss: continue` is admitted at a
step boundary every member agrees on (`Admissions`), the mirror of a planned leave
(`departure.Departures`)."""

from __future__ import annotations

from hetflow.training.elastic.world import ElasticWorld


class Admissions:
    """The members' side of the joins into `world`.

    A joiner that is ready writes `join/R` and counts itself in `asks` (`ElasticWorld.join`).
    At each boundary b every member reads `asks` (one round trip) and, where it grew, looks
    for the slot that asks; the first member to see one writes `gG/admit` = 'b+1:R' (first
    writer wins: one joiner per generation, a second one is admitted in the next). Every
    member reads that key at each boundary and, at b+1, regroups with R. b+1 is the same
    boundary for all, for the reason `Departures` gives: no member can finish step b before
    the writer, at boundary b, has written and joined step b's all-reduce."""

    def __init__(self, world: ElasticWorld) -> None:
        self.world = world
        self.seen = 0

    def admitting(self, step: int) -> int | None:
        """Before step `step`: the rank that joins here, if one does."""
        w = self.world
        key = f"g{w.gen}/admit"
        if not w.store.check([key]):
            asks = int(w.store.add("asks", 0))
            if asks == self.seen:
                return None
            self.seen = asks
            who = self.asking()
            if who is None:
                return None
            w.store.compare_set(key, "", f"{step + 1}:{who}")
        at, who = (int(x) for x in w.store.get(key).decode().split(":"))
        return who if step >= at else None

    def pending(self) -> int | None:
        """The rank this generation admits, where one was agreed (at whatever step): a regroup
        for another reason takes it in at once."""
        key = f"g{self.world.gen}/admit"
        if not self.world.store.check([key]):
            return None
        return int(self.world.store.get(key).decode().split(":")[1])

    def asking(self) -> int | None:
        """The lowest rank, not a member, whose worker asks to join and is not dead."""
        w = self.world
        for r in range(w.world):
            if r in w.members or not w.store.check([f"join/{r}"]):
                continue
            if not w.store.check([f"dead/{r}"]):
                return r
        return None
