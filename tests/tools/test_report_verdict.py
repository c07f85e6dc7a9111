"""The verdicts of the shuffle report: each p-value against simulation of what it claims, the
power rule against buffers that are and are not visible, and the verdicts on known orders."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfeed.tools.shuffle_report.buffer import buffer_shuffle_order
from shardfeed.tools.shuffle_report.stats import order_stats, spearman_rho
from shardfeed.tools.shuffle_report.verdict import (
    ALPHA,
    Design,
    chi2_bins,
    class_counts,
    expected_buffer_rho,
    missing_class_p_value,
    rho_p_value,
)


def permutations(n: int, count: int, seed: int) -> np.ndarray:
    """``count`` uniform permutations of ``n``, one a row."""
    rng = np.random.Generator(np.random.Philox(seed))
    return np.argsort(rng.random((count, n)), axis=1)


def verdict(order: np.ndarray, labels: np.ndarray, buffer_size: int) -> str:
    design = Design(records=order.size, class_counts=class_counts(labels, int(labels.max()) + 1),
                    buffer_size=buffer_size)
    stats = order_stats(order, labels=labels, batch_size=8)
    return design.judge(
        rho=stats.spearman_rho, chi2_p_value=None if stats.chi2 is None else stats.chi2.p_value,
        latest_first_position=stats.latest_first_position,
    )[0]


@pytest.mark.parametrize("n, buffer_size", [(36, 10), (20, 10), (7, 3), (1_000, 500),
                                            (1_000, 999), (50, 50), (50, 1), (3_000, 40)])
def test_expected_buffer_rho_is_the_mean_of_simulated_buffers(n: int, buffer_size: int) -> None:
    rhos = np.array([spearman_rho(buffer_shuffle_order(n, buffer_size, s)) for s in range(400)])
    expected = expected_buffer_rho(n, buffer_size)
    standard_error = max(rhos.std() / math.sqrt(rhos.size), 1e-9)
    assert abs(rhos.mean() - expected) < 4.5 * standard_error + 1e-12


def test_expected_buffer_rho_at_the_extremes() -> None:
    assert expected_buffer_rho(100, 1) == pytest.approx(1.0)  # a buffer of 1 does not shuffle
    assert expected_buffer_rho(100, 100) == pytest.approx(0.0, abs=1e-12)  # holds every record
    assert expected_buffer_rho(100, 10**6) == pytest.approx(0.0, abs=1e-12)
    # the README's figure: 100 classes of 1,000 records, a buffer of 10,000
    assert expected_buffer_rho(100_000, 10_000) == pytest.approx(0.948, abs=1e-3)


def test_rho_p_value_never_overstates_the_evidence() -> None:
    """The normal tail is conservative: uniform permutations reach |rho| >= r no more often
    than rho_p_value(r) says."""
    for n in (10, 36, 200):
        orders = permutations(n, 20_000, n)
        # Spearman rho of a permutation: 1 - 6 sum d^2 / (n (n^2 - 1)) (checked on one)
        squares = ((orders - np.arange(n)) ** 2).sum(axis=1)
        rhos = np.abs(1 - 6 * squares / (n * (n * n - 1)))
        assert rhos[0] == pytest.approx(abs(spearman_rho(orders[0])))
        for quantile in (0.9, 0.99, 0.999):
            r = float(np.quantile(rhos, quantile))
            assert np.mean(rhos >= r) <= rho_p_value(r, n) * 1.15 + 2e-4
    assert rho_p_value(0.0, 36) == pytest.approx(1.0)
    assert rho_p_value(1.0, 36) == pytest.approx(math.erfc(math.sqrt(35 / 2)))
    with pytest.raises(ValueError, match="rho must be a correlation"):
        rho_p_value(1.5, 10)


def test_missing_class_p_value_is_exact_for_one_class_and_an_upper_bound_for_several() -> None:
    # one class of 5 among 30: chance it is absent from the first 10 positions, exactly
    assert missing_class_p_value([5, 25], 10) == pytest.approx(
        math.comb(25, 10) / math.comb(30, 10), rel=1e-9)
    counts = [12, 12, 12]
    labels = np.repeat(np.arange(3), 12)
    latest = np.array([
        max(int(np.argmax(labels[p] == c)) for c in range(3)) for p in permutations(36, 20_000, 5)
    ])
    for t in (3, 6, 9, 12):
        assert np.mean(latest >= t) <= missing_class_p_value(counts, t) + 0.01
    assert missing_class_p_value(counts, 0) == 1.0
    assert missing_class_p_value(counts, 25) == 0.0  # every class has shown up by then
    with pytest.raises(ValueError, match="position must be <="):
        missing_class_p_value(counts, 37)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(min_value=0, max_value=100_000))
def test_chi2_bins_keep_every_expected_count_at_five(n: int) -> None:
    k = chi2_bins(n)
    assert k <= 10
    if k >= 2:
        assert n / k**2 >= 5
    if k < 10:  # one more bin a side would break Cochran's rule
        assert n / (k + 1) ** 2 < 5


def test_tests_run_depend_on_records_and_classes() -> None:
    assert Design(records=19, class_counts=(), buffer_size=5).tests == ("rho",)
    assert Design(records=20, class_counts=(), buffer_size=5).tests == ("rho", "chi2")
    assert Design(records=20, class_counts=(20,), buffer_size=5).tests == ("rho", "chi2")
    assert Design(records=20, class_counts=(10, 10), buffer_size=5).tests == (
        "rho", "chi2", "last_class")
    with pytest.raises(ValueError, match="class_counts add up to 19"):
        Design(records=20, class_counts=(10, 9), buffer_size=5)


def test_too_small_is_where_the_tests_would_miss_the_buffer() -> None:
    # 36 records: a buffer of 10 (rho ~ +0.73) is visible, one of 20 (rho ~ +0.31) is not
    assert Design(records=36, class_counts=(12, 12, 12), buffer_size=10).can_tell
    assert not Design(records=36, class_counts=(12, 12, 12), buffer_size=20).can_tell
    # a buffer holding every record is uniform: then the question is whether no shuffle shows
    assert Design(records=36, class_counts=(12, 12, 12), buffer_size=36).reference == (
        "no shuffle", 1.0)
    assert Design(records=36, class_counts=(12, 12, 12), buffer_size=36).can_tell
    # 11 records, the rank test alone: not even rho = 1 reaches its level
    small = Design(records=11, class_counts=(), buffer_size=11)
    assert small.rho_limit > 1 and not small.can_tell


def test_uniform_permutations_are_flagged_at_most_alpha_of_the_time() -> None:
    labels = np.repeat(np.arange(3), 12)
    flagged = sum(verdict(p, labels, 10) == "not uniform" for p in permutations(36, 5_000, 9))
    assert flagged <= 3 * 5_000 * ALPHA  # at most ALPHA, with room for binomial noise


def test_the_tour_buffer_is_flagged_nearly_always() -> None:
    """36 records in 3 sorted classes, a buffer of 10: what README's tour runs."""
    labels = np.repeat(np.arange(3), 12)
    verdicts = [verdict(buffer_shuffle_order(36, 10, s), labels, 10) for s in range(500)]
    assert verdicts.count("not uniform") >= 480
    assert set(verdicts) <= {"not uniform", "looks uniform"}


def test_verdicts_on_known_orders() -> None:
    labels = np.repeat(np.arange(4), 250)
    assert verdict(np.arange(1_000), labels, 100) == "not uniform"
    assert verdict(np.arange(1_000)[::-1], labels, 100) == "not uniform"  # reversed: rho = -1
    assert verdict(buffer_shuffle_order(1_000, 100, 0), labels, 100) == "not uniform"
    assert verdict(permutations(1_000, 1, 3)[0], labels, 100) == "looks uniform"
    # five records: nothing can be told, not even that the stored order is not shuffled
    few = np.array([0, 0, 1, 1, 1])
    assert verdict(np.arange(5), few, 2) == "too small to tell"
    assert verdict(np.array([4, 1, 3, 0, 2]), few, 2) == "too small to tell"


def test_last_class_limits() -> None:
    design = Design(records=36, class_counts=(12, 12, 12), buffer_size=10)
    limits = design.last_class_limits()
    assert limits is not None
    assert missing_class_p_value([12, 12, 12], limits["limit"]) <= design.level
    assert missing_class_p_value([12, 12, 12], limits["limit"] - 1) > design.level
    assert missing_class_p_value([12, 12, 12], limits["typical"]) <= 0.5
    assert Design(records=36, class_counts=(), buffer_size=10).last_class_limits() is None
