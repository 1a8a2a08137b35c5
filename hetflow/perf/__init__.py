"""The performance model (pure: no torch, no I/O, of hetflow only its one-line error): what
one step of data-parallel training takes on a set of devices.

- `curve`: a device's compute time against its local batch: a line (`Line`, a + c x b), a
  table of published times (`Table`), measured points joined piecewise-linearly (`Curve`),
  and a share run as micro-batches under a memory cap (`Micro`).
- `collective`: the collectives' times on the ring's alpha-beta model: all-reduce,
  all-gather, reduce-scatter, a round's outer all-reduce, DDP's buckets, and an all-reduce
  measured over one ring size carried to another.
- `balance`: the one balancing solver: the step time at which the devices' shares add up to
  the global batch (`balanced_time`), and integer shares that reach it (`fill`).
- `fitting`: lines fitted to measured points.

The planner, the re-balancer, the forecast (simulate, rent), the queue's allocator and the
DiLoCo round sizing all call it; none carries its own formula (AdaptDL's `goodput.py`: one
model that the trainer fits and the scheduler evaluates).

>>> from hetflow.perf import Line, balanced_time, ring_allreduce_time
>>> round(balanced_time([Line(0.01, 1e-3), Line(0.01, 1e-3)], 64), 6)
0.042
>>> round(ring_allreduce_time(100e6, 4, 25e-6, 10.0), 6)  # 6 hops + 150 MB at 10 Gbit/s
0.12015
"""

from hetflow.perf.balance import balanced_time, fill
from hetflow.perf.collective import ring_allreduce_time
from hetflow.perf.curve import Curve, Line, Micro, Table

__all__ = ["Curve", "Line", "Micro", "Table", "balanced_time", "fill", "ring_allreduce_time"]
