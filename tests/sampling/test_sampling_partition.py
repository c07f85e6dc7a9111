"""RankShare: disjoint equal shares covering the epoch, prefix consumption, exact elastic resume."""

from __future__ import annotations

from collections import Counter
from typing import Literal

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardfeed.sampling import RankShare

Remainder = Literal["drop", "pad"]


def shares(
    total: int, world: int, *, start: int = 0, remainder: Remainder = "drop"
) -> list[np.ndarray]:
    return [RankShare(total, rank=r, world_size=world, start=start, remainder=remainder)[:]
            for r in range(world)]


@given(total=st.integers(0, 500), world=st.integers(1, 17), data=st.data())
def test_drop_shares_are_disjoint_equal_and_cover_all_but_the_tail(
    total: int, world: int, data: st.DataObject
) -> None:
    start = data.draw(st.integers(0, total))
    parts = shares(total, world, start=start)
    lengths = {len(p) for p in parts}
    assert lengths == {(total - start) // world}
    union = np.concatenate(parts)
    assert np.unique(union).size == union.size  # disjoint
    covered = set(union.tolist())
    expected = set(range(start, start + len(parts[0]) * world))
    assert covered == expected  # a prefix of the remaining epoch; the tail < world dropped
    assert total - start - len(covered) < world


@given(total=st.integers(1, 500), world=st.integers(1, 17), data=st.data())
def test_pad_shares_are_equal_and_cover_everything(
    total: int, world: int, data: st.DataObject
) -> None:
    start = data.draw(st.integers(0, total))
    parts = shares(total, world, start=start, remainder="pad")
    length = -(-(total - start) // world)
    assert all(len(p) == length for p in parts)
    union = np.concatenate(parts)
    assert set(union.tolist()) >= set(range(start, total))
    assert union.min(initial=0) >= 0 and union.max(initial=0) < total
    # The remaining positions once each, plus padding that wraps to the epoch's start: 0, 1, ...
    padded = length * world - (total - start)
    assert padded < world
    wrapped = [q % total for q in range(total, total + padded)]
    assert sorted(union.tolist()) == sorted(list(range(start, total)) + wrapped)


def test_pad_wraps_to_the_beginning_of_the_epoch() -> None:
    assert RankShare(14, rank=1, world_size=4, remainder="pad")[:].tolist() == [1, 5, 9, 13]
    assert RankShare(14, rank=2, world_size=4, remainder="pad")[:].tolist() == [2, 6, 10, 0]
    assert RankShare(14, rank=3, world_size=4, remainder="pad")[:].tolist() == [3, 7, 11, 1]
    assert RankShare(14, rank=1, world_size=4)[:].tolist() == [1, 5, 9]


@given(total=st.integers(0, 300), world=st.integers(1, 9), data=st.data())
def test_after_every_step_the_ranks_have_consumed_a_prefix(
    total: int, world: int, data: st.DataObject
) -> None:
    parts = shares(total, world)
    steps = data.draw(st.integers(0, len(parts[0])))
    done = sorted(np.concatenate([p[:steps] for p in parts]).tolist())
    consumed = RankShare(total, rank=0, world_size=world).consumed(steps)
    assert done == list(range(consumed))


@pytest.mark.parametrize("new_world", [2, 3, 8])
@pytest.mark.parametrize("total", [1000, 1003])
def test_resume_on_another_world_size_covers_the_rest_exactly_once(
    total: int, new_world: int
) -> None:
    world, steps = 4, 37
    before = np.concatenate([p[:steps] for p in shares(total, world, remainder="pad")])
    consumed = RankShare(total, rank=0, world_size=world, remainder="pad").consumed(steps)
    assert consumed == world * steps
    after = np.concatenate(shares(total, new_world, start=consumed, remainder="pad"))
    rest = after
    # Every unconsumed position exactly once; padding only repeats already-seen positions.
    counts = Counter(rest.tolist())
    unconsumed = set(range(consumed, total))
    assert all(counts[q] == 1 for q in unconsumed)
    assert set(before.tolist()) | unconsumed == set(range(total))
    assert not set(before.tolist()) & unconsumed
    padding = [q for q in rest.tolist() if q not in unconsumed]
    assert len(padding) == len(rest) - len(unconsumed) < new_world
    # And with drop, nothing is seen twice; only fewer than new_world positions are left out.
    dropped = np.concatenate(shares(total, new_world, start=consumed))
    assert np.unique(dropped).size == dropped.size
    assert set(dropped.tolist()) <= unconsumed
    assert len(unconsumed) - dropped.size < new_world


def test_indexing_forms() -> None:
    share = RankShare(20, rank=2, world_size=3, start=4)
    assert share[:].tolist() == [6, 9, 12, 15, 18]
    assert share[0] == 6 and share[-1] == 18
    assert share[np.array([1, 3])].tolist() == [9, 15]
    assert share.consumed(2) == 10 and share.consumed(len(share)) == 19


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"total": 10, "rank": 4, "world_size": 4}, ValueError,
         r"rank must be in \[0, world_size\)"),
        ({"total": 10, "rank": 0, "world_size": 0}, ValueError, "world_size must be >= 1"),
        ({"total": 10, "rank": 0, "world_size": 2, "start": 11}, ValueError, "start must be in"),
        ({"total": -1, "rank": 0, "world_size": 1}, ValueError, "total must be >= 0"),
        ({"total": 10, "rank": 0, "world_size": 2, "remainder": "wrap"}, ValueError,
         "remainder must be 'drop' or 'pad'"),
        ({"total": 10, "rank": 0.0, "world_size": 2}, TypeError, "rank must be an integer"),
    ],
)
def test_bad_arguments_name_the_value(kwargs: dict[str, object], error: type, match: str) -> None:
    total = kwargs.pop("total")
    with pytest.raises(error, match=match):
        RankShare(total, **kwargs)  # type: ignore[arg-type]


def test_step_out_of_range() -> None:
    share = RankShare(10, rank=0, world_size=3)
    with pytest.raises(IndexError, match="step 3 out of range"):
        share[3]
    with pytest.raises(ValueError, match="steps must be in"):
        share.consumed(4)
