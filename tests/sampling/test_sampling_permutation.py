"""EpochOrder: a permutation for every n, keyed by (seed, epoch), uniform (exact), bijective."""

from __future__ import annotations

from typing import Literal

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from shardfeed.sampling import EpochOrder, FeistelPermutation

Method = Literal["exact", "bijection"]
METHODS: list[Method] = ["exact", "bijection"]
SEED = st.integers(min_value=0, max_value=2**64 - 1)


@pytest.mark.parametrize("method", METHODS)
@given(n=st.integers(0, 3000), seed=SEED, epoch=st.integers(0, 10**6))
@settings(max_examples=60, deadline=None)
def test_every_order_is_a_permutation(method: Method, n: int, seed: int, epoch: int) -> None:
    order = EpochOrder(n, seed=seed, epoch=epoch, shuffle=True, method=method)
    units = order[:]
    assert len(order) == n
    np.testing.assert_array_equal(np.sort(units), np.arange(n))
    np.testing.assert_array_equal(order.positions_of(units), np.arange(n))
    if n:
        assert order[n - 1] == units[-1] and order[-1] == units[-1]


@pytest.mark.parametrize("method", METHODS)
def test_order_is_reproducible_and_differs_by_epoch_and_seed(method: Method) -> None:
    def units(seed: int, epoch: int) -> np.ndarray:
        return EpochOrder(500, seed=seed, epoch=epoch, shuffle=True, method=method)[:]

    np.testing.assert_array_equal(units(1, 0), units(1, 0))
    orders = [units(1, 0), units(1, 1), units(2, 0), units(2, 1)]
    for i in range(len(orders)):
        for j in range(i + 1, len(orders)):
            # Two independent orders of 500 units agree in about one place.
            assert (orders[i] == orders[j]).sum() < 10


def test_golden_first_indices() -> None:
    """The first 10 units of n=1000, seed=0, epoch=0. Changing them changes the order every
    existing training run sees: it is a breaking change (note it in CHANGELOG.md)."""
    order = EpochOrder(1000, seed=0, epoch=0, shuffle=True)
    assert order[:10].tolist() == [229, 816, 200, 732, 43, 82, 823, 300, 801, 32]


def test_golden_first_indices_bijection() -> None:
    """Same for the memory-free order (also a breaking change if it moves)."""
    order = EpochOrder(1000, seed=0, epoch=0, shuffle=True, method="bijection")
    assert order[:10].tolist() == GOLDEN_BIJECTION


GOLDEN_BIJECTION = [910, 869, 741, 863, 257, 660, 973, 456, 470, 766]


@pytest.mark.parametrize("method", METHODS)
def test_no_shuffle_is_the_identity(method: Method) -> None:
    order = EpochOrder(10, seed=3, epoch=9, shuffle=False, method=method)
    assert order[:].tolist() == list(range(10))
    assert order.nbytes == 0


def test_exact_order_takes_four_bytes_a_unit() -> None:
    order = EpochOrder(10_000, seed=0, epoch=0, shuffle=True)
    assert order.nbytes == 40_000
    order.positions_of([1, 2])
    assert order.nbytes == 80_000  # the inverse, built on demand


def _decile_table(orders: list[np.ndarray], n: int) -> np.ndarray:
    table = np.zeros((10, 10), dtype=np.int64)
    position_decile = np.arange(n) * 10 // n
    for units in orders:
        np.add.at(table, (position_decile, units * 10 // n), 1)
    return table


def test_exact_order_is_uniform_position_decile_by_unit_decile() -> None:
    n = 1000
    orders = [EpochOrder(n, seed=s, epoch=0, shuffle=True)[:] for s in range(200)]
    table = _decile_table(orders, n)
    assert stats.chi2_contingency(table).pvalue > 1e-3
    # And each single position is uniform over the units across seeds/epochs.
    first = [EpochOrder(n, seed=7, epoch=e, shuffle=True)[0] for e in range(2000)]
    assert stats.chisquare(np.bincount(np.array(first) * 10 // n, minlength=10)).pvalue > 1e-3


def test_decile_check_rejects_a_shuffle_buffer() -> None:
    # The same check on a buffered shuffle (buffer of 100 over sorted data) must reject it,
    # or the uniformity tests above could not fail.
    n, buffer = 1000, 100
    orders = []
    for s in range(200):
        rng = np.random.default_rng(s)
        pool, out = list(range(buffer)), []
        for nxt in range(buffer, n):
            out.append(pool.pop(int(rng.integers(len(pool)))))
            pool.append(nxt)
        out.extend(rng.permutation(pool).tolist())
        orders.append(np.array(out))
    assert stats.chi2_contingency(_decile_table(orders, n)).pvalue < 1e-6


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 1000, 2**20 + 1])
def test_bijection_for_awkward_sizes(n: int) -> None:
    order = EpochOrder(n, seed=11, epoch=2, shuffle=True, method="bijection")
    units = order[:]
    assert np.unique(units).size == n and units.min() == 0 and units.max() == n - 1
    np.testing.assert_array_equal(order.positions_of(units), np.arange(n))
    assert order.nbytes == 0


def test_bijection_reaches_every_order_of_small_n() -> None:
    seen = {tuple(EpochOrder(3, seed=s, epoch=0, shuffle=True, method="bijection")[:].tolist())
            for s in range(300)}
    assert len(seen) == 6


def test_bijection_passes_a_weaker_uniformity_check() -> None:
    n = 1000
    orders = [EpochOrder(n, seed=s, epoch=0, shuffle=True, method="bijection")[:]
              for s in range(200)]
    table = _decile_table(orders, n)
    assert stats.chi2_contingency(table).pvalue > 1e-4
    assert np.abs(table / table.mean() - 1).max() < 0.15
    first = [EpochOrder(n, seed=s, epoch=1, shuffle=True, method="bijection")[0]
             for s in range(2000)]
    assert stats.chisquare(np.bincount(np.array(first) * 10 // n, minlength=10)).pvalue > 1e-4


def test_bijection_handles_a_trillion_units_without_memory() -> None:
    n = 10**12
    order = EpochOrder(n, seed=1, epoch=0, shuffle=True, method="bijection")
    positions = np.array([0, 1, 2, n - 1, 123_456_789_012])
    units = order[positions]
    assert (units >= 0).all() and (units < n).all() and np.unique(units).size == 5
    np.testing.assert_array_equal(order.positions_of(units), positions)
    assert order[5] == int(order[np.array([5])][0])


@given(n=st.integers(2, 5000), key=st.integers(0, 2**64 - 1),
       values=st.lists(st.integers(0, 10**9), min_size=1, max_size=20))
def test_feistel_inverse_undoes_forward(n: int, key: int, values: list[int]) -> None:
    perm = FeistelPermutation(n, key=key)
    x = np.array(values, dtype=np.int64) % n
    np.testing.assert_array_equal(perm.inverse(perm.forward(x)), x)
    np.testing.assert_array_equal(perm.forward(perm.inverse(x)), x)


def test_indexing_forms_and_errors() -> None:
    order = EpochOrder(10, seed=0, epoch=0, shuffle=True)
    units = order[:]
    assert order[np.array([3, 1])].tolist() == [units[3], units[1]]
    assert order[[2]].tolist() == [units[2]]
    assert order[2:5].tolist() == units[2:5].tolist()
    with pytest.raises(IndexError, match="epoch position 10 out of range"):
        order[10]
    with pytest.raises(IndexError, match="out of range"):
        order[np.array([0, -1])]
    with pytest.raises(IndexError, match="unit 10 out of range"):
        order.positions_of([10])
    with pytest.raises(ValueError, match="method must be 'exact'"):
        EpochOrder(3, seed=0, epoch=0, shuffle=True, method="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n must be >= 0"):
        EpochOrder(-1, seed=0, epoch=0, shuffle=True)
    with pytest.raises(TypeError, match="shuffle must be True or False"):
        EpochOrder(3, seed=0, epoch=0, shuffle="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seed must be in"):
        EpochOrder(3, seed=-5, epoch=0, shuffle=True)


@given(n=st.integers(0, 5000), seed=SEED, data=st.data())
@settings(max_examples=50)
def test_single_lookups_match_array_lookups(n: int, seed: int, data: st.DataObject) -> None:
    for method in METHODS:
        order = EpochOrder(n, seed=seed, epoch=3, shuffle=True, method=method)
        if n == 0:
            continue
        p = data.draw(st.integers(0, n - 1))
        unit = order[p]
        assert isinstance(unit, int) and unit == int(order[np.array([p])][0])
        assert int(order.positions_of([unit])[0]) == p
        if order._bijection is not None:
            assert order._bijection.inverse_one(unit) == p


def test_feistel_rejects_values_outside_its_domain() -> None:
    perm = FeistelPermutation(1000, key=5)
    with pytest.raises(IndexError, match="value 1000 out of range"):
        perm.forward(np.array([1000]))
    with pytest.raises(IndexError, match="value 1023 out of range"):
        perm.forward_one(1023)
    with pytest.raises(IndexError, match="out of range"):
        perm.inverse(np.array([-1]))


@pytest.mark.parametrize(("method", "shuffle"), [("exact", True), ("bijection", True),
                                                 ("exact", False)])
def test_take_is_getitem_for_a_slices_positions_and_refuses_the_same(
        method: Literal["exact", "bijection"], shuffle: bool) -> None:
    """``take`` (a loader's slice: an int64 array) gives what ``order[...]`` gives, int64,
    and refuses a position before 0 or past the end as it does (IndexError)."""
    order = EpochOrder(1000, seed=1, epoch=2, shuffle=shuffle, method=method)
    for positions in (np.array([5, 999, 0, 17]), np.arange(100, 356), np.zeros(0, np.int64)):
        got = order.take(positions.astype(np.int64))
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, order[positions])
    for bad in ([1000], [-1], [3, 1000], [-5, 2]):
        with pytest.raises(IndexError):
            order.take(np.array(bad, dtype=np.int64))
