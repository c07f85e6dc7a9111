"""The image cache's keys by expiry: the earliest expiry before the clock, its keys, and a
heap that stays small however often expiries change."""

from __future__ import annotations

import numpy as np

from shardfeed.pipeline.expiry_index import ExpiryIndex


def test_the_earliest_expiry_before_the_clock_and_its_keys() -> None:
    index = ExpiryIndex()
    assert index.earliest_before((9, 9)) is None
    index.add("a", (0, 5))
    index.add("b", (0, 3))
    index.add("c", (0, 3))
    assert index.earliest_before((0, 3)) is None  # expired means before the clock
    assert index.earliest_before((0, 4)) == {"b", "c"}
    index.move("b", (0, 3), (0, 9))
    index.remove("c", (0, 3))
    assert index.earliest_before((0, 6)) == {"a"}
    index.reset(["x", "y"], (-1, -1))
    assert index.earliest_before((0, 0)) == {"x", "y"}
    index.reset()
    assert index.earliest_before((9, 9)) is None


def test_many_changes_of_expiry_keep_the_answer_and_a_small_heap() -> None:
    """Entries whose expiries change on every use (a hit extends them) against a dict of
    their expiries: the same earliest set after each change, and the heap never more than
    a few times the most expiries that have keys at once (20 keys: at most 20)."""
    rng = np.random.default_rng(3)
    index = ExpiryIndex()
    expiry: dict[int, tuple[int, int]] = {}
    for step in range(5000):
        key = int(rng.integers(0, 20))
        new = (0, int(rng.integers(0, 200)))
        if key in expiry:
            index.move(key, expiry[key], new)
        else:
            index.add(key, new)
        expiry[key] = new
        clock = (0, int(rng.integers(0, 220)))
        before = [e for e in expiry.values() if e < clock]
        want = {k for k, e in expiry.items() if before and e == min(before)} or None
        assert index.earliest_before(clock) == want, step
        assert len(index._heap) <= 4 * 20 + 65
