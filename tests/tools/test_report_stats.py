"""Statistics of an order, on orders whose answers are known, and against SciPy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfeed.tools.shuffle_report.stats import (
    chi2_sf,
    decile_chi2,
    expected_labels_per_batch,
    label_first_positions,
    mean_abs_displacement,
    mean_labels_per_batch,
    order_stats,
    spearman_rho,
)


def uniform_permutation(n: int, seed: int) -> np.ndarray:
    """A stand-in for an exact shuffle: a Philox-keyed uniform permutation."""
    return np.random.Generator(np.random.Philox(seed)).permutation(n)


def test_identity_order_is_perfectly_correlated_and_rejected() -> None:
    order = np.arange(10_000)
    stats = order_stats(order)
    assert stats.spearman_rho == pytest.approx(1.0)
    assert stats.mean_abs_displacement == 0.0
    assert stats.chi2.dof == 81
    assert stats.chi2.p_value < 1e-12


def test_reverse_order_has_rho_minus_one() -> None:
    order = np.arange(10_000)[::-1]
    assert spearman_rho(order) == pytest.approx(-1.0)
    assert mean_abs_displacement(order) == pytest.approx(0.5, abs=1e-3)
    assert decile_chi2(order).p_value < 1e-12


def test_uniform_permutation_looks_uniform() -> None:
    n = 100_000
    stats = order_stats(uniform_permutation(n, 7))
    assert abs(stats.spearman_rho) < 4 / math.sqrt(n)
    assert stats.mean_abs_displacement == pytest.approx(1 / 3, abs=0.005)
    assert stats.chi2.p_value > 1e-4


def test_chi2_of_uniform_permutations_does_not_reject_over_many_seeds() -> None:
    p_values = np.array([decile_chi2(uniform_permutation(5_000, s)).p_value for s in range(200)])
    # Under the null hypothesis p is uniform on [0, 1]: about 1% below 0.01, mean about 0.5.
    assert np.mean(p_values < 0.01) <= 0.05
    assert 0.4 < p_values.mean() < 0.6
    assert scipy.stats.kstest(p_values, "uniform").pvalue > 1e-3


def test_chi2_matches_scipy_contingency() -> None:
    n = 20_000
    labels_sorted = np.arange(n)
    for order in (uniform_permutation(n, 3), labels_sorted, np.roll(labels_sorted, 777)):
        ours = decile_chi2(order)
        table = np.zeros((10, 10))
        np.add.at(table, (np.arange(n) * 10 // n, order * 10 // n), 1)
        statistic, p_value, dof, _ = scipy.stats.chi2_contingency(table, correction=False)
        assert ours.statistic == pytest.approx(statistic, rel=1e-9)
        assert ours.dof == dof
        assert ours.p_value == pytest.approx(p_value, abs=1e-6)


@settings(max_examples=300, deadline=None)
@given(
    dof=st.integers(min_value=1, max_value=400),
    statistic=st.floats(min_value=0.0, max_value=2_000.0, allow_nan=False),
)
def test_chi2_sf_matches_scipy(dof: int, statistic: float) -> None:
    expected = float(scipy.stats.chi2.sf(statistic, dof))
    ours = chi2_sf(statistic, dof)
    assert ours == pytest.approx(expected, abs=1e-10, rel=1e-7)


@pytest.mark.filterwarnings("ignore::scipy.stats.ConstantInputWarning")
@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.integers(min_value=0, max_value=30), min_size=3, max_size=200))
def test_spearman_matches_scipy_also_with_ties(values: list[int]) -> None:
    order = np.array(values)
    expected = scipy.stats.spearmanr(np.arange(order.size), order).statistic
    if np.isnan(expected):  # constant order: no correlation defined, we report 0
        assert spearman_rho(order) == 0.0
    else:
        assert spearman_rho(order) == pytest.approx(expected, abs=1e-9)


def test_first_label_positions_on_a_crafted_order() -> None:
    labels = np.array([0, 0, 1, 1, 2, 2, 3])  # record i has labels[i]
    order = np.array([1, 3, 0, 2, 5, 4])  # record 6 (label 3) never comes out
    assert label_first_positions(order, labels) == {0: 0, 1: 1, 2: 4, 3: -1}
    stats = order_stats(order, labels=labels, batch_size=2)
    assert stats.latest_label == 2
    assert stats.latest_first_position == 4
    # batches [0,1] [0,1] [2,2]
    assert stats.mean_labels_per_batch == pytest.approx(5 / 3)


def test_labels_per_batch_on_sorted_and_interleaved_orders() -> None:
    labels = np.repeat(np.arange(4), 8)  # 32 records, 4 classes
    assert mean_labels_per_batch(np.arange(32), labels, 8) == 1.0
    interleaved = np.arange(32).reshape(4, 8).T.reshape(-1)
    assert mean_labels_per_batch(interleaved, labels, 8) == 4.0
    # fewer records than one batch: the single partial batch counts
    assert mean_labels_per_batch(interleaved[:3], labels, 8) == 3.0


def test_expected_labels_per_batch_matches_the_combinatorial_formula() -> None:
    labels = np.array([0] * 5 + [1] * 3 + [2] * 2)
    n, b = 10, 4
    exact = sum(1 - math.comb(n - c, b) / math.comb(n, b) for c in (5, 3, 2))
    assert expected_labels_per_batch(labels, b) == pytest.approx(exact, rel=1e-12)
    # against simulation with uniform permutations
    simulated = np.mean(
        [mean_labels_per_batch(uniform_permutation(10, s)[:4], labels, 4) for s in range(4000)]
    )
    assert simulated == pytest.approx(exact, abs=0.03)


def test_bad_orders_are_refused_with_the_fix() -> None:
    with pytest.raises(TypeError, match="1-D integer"):
        spearman_rho(np.zeros((3, 3), dtype=np.int64))
    with pytest.raises(TypeError, match="1-D integer"):
        spearman_rho(np.array([0.5, 1.5]))
    with pytest.raises(ValueError, match="at least 2"):
        spearman_rho(np.array([0]))
    with pytest.raises(ValueError, match="num_records"):
        mean_abs_displacement(np.array([0, 5]), num_records=3)
    with pytest.raises(ValueError, match="one label per record"):
        order_stats(np.arange(4), labels=np.zeros(4), num_records=5)
    with pytest.raises(ValueError, match="batch_size"):
        mean_labels_per_batch(np.arange(4), np.zeros(4), 0)


def test_stats_to_json_is_plain() -> None:
    import json

    stats = order_stats(np.array([2, 0, 1, 3]), labels=np.array([5, 5, 7, 7]), batch_size=2)
    data = json.loads(json.dumps(stats.to_json()))
    assert data["label_first_positions"] == {"5": 1, "7": 0}
    assert data["latest_label"] == "5"
    assert set(data) >= {"spearman_rho", "mean_abs_displacement", "chi2", "chi2_p_value"}
