"""The out-of-memory search's logic (`probes.memory.largest_fitting`) on fake predicates
`fits(batch)`: the cap it returns fits and cap + 1 does not. Pure; the search on a real GPU is
tests/integration/training/test_cuda.py's and `benchmarks.gpu_all --oom-search`'s."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hetflow.training.probes.memory import largest_fitting


class Fits:
    """Batches up to `cap` fit; the batches in `fail_once` fail at their first try only (a
    GPU whose last failed pass has not freed its memory yet). Every try is recorded."""

    def __init__(self, cap: int, fail_once: set[int] | None = None) -> None:
        self.cap, self.fail_once, self.tries = cap, set(fail_once or ()), []

    def __call__(self, batch: int) -> bool:
        self.tries.append(batch)
        if batch in self.fail_once:
            self.fail_once.discard(batch)
            return False
        return batch <= self.cap


@settings(max_examples=300, deadline=None)
@given(cap=st.integers(0, 5000), limit=st.integers(0, 6000))
def test_the_cap_fits_and_one_more_does_not(cap, limit):
    fits = Fits(cap)
    found = largest_fitting(fits, limit)
    assert found == min(cap, limit)
    assert found == 0 or found in fits.tries  # tried, not assumed
    if found < limit:
        assert fits.tries[-1] == found + 1  # cap + 1 failed last, after the search


def test_the_search_takes_logarithmically_many_tries():
    fits = Fits(192)
    assert largest_fitting(fits, 1 << 14) == 192
    assert len(fits.tries) <= 2 * 14 + 2


def test_nothing_fits_gives_0_and_a_limit_that_fits_gives_the_limit():
    assert largest_fitting(Fits(0), 1 << 14) == 0
    fits = Fits(10**9)
    assert largest_fitting(fits, 300) == 300 and max(fits.tries) == 300


def test_a_try_that_failed_once_and_fits_later_does_not_end_the_search_below_the_cap():
    """Last run on the GPU host: cap 192 reported, and 193 fitted when tried again. A search
    that believes a spurious failure ends below the cap; this one tries cap + 1 again and goes
    on up from there."""
    fits = Fits(200, fail_once={193, 194, 196})
    assert largest_fitting(fits, 1 << 14) == 200
    assert fits.tries[-1] == 201


@settings(max_examples=200, deadline=None)
@given(cap=st.integers(1, 3000), data=st.data())
def test_spurious_failures_below_the_cap_still_find_it(cap, data):
    fail_once = data.draw(st.sets(st.integers(1, cap), max_size=3))
    fits = Fits(cap, fail_once)
    assert largest_fitting(fits, 1 << 13, rounds=len(fail_once) + 1) == min(cap, 1 << 13)


def test_after_its_rounds_it_returns_the_last_batch_that_fitted():
    """A predicate whose first try fails at every batch past 500: the rounds bound the
    search, and what it returns fitted when last tried."""
    fits = Fits(1000, fail_once=set(range(501, 1001)))
    found = largest_fitting(fits, 1 << 12, rounds=2)
    assert 500 < found < 1000 and fits.tries.count(found) == 2  # failed once, then fitted
