"""Verdicts on orders: is an order a uniform random permutation, and can this many records tell?

Each order of a shuffle report is tested against one hypothesis, H0: "the order is a uniform
random permutation of the records". Three tests, each run only where it can say something:

- **rank correlation**: Spearman rho of position vs stored index has mean 0 and variance
  exactly ``1/(n-1)`` under H0; ``z = rho * sqrt(n - 1)`` is compared with the standard normal,
  two-sided. rho is bounded in [-1, 1], so its tails are lighter than the normal's: the p-value
  errs on the side of "not proven", never on the side of a false alarm.
- **chi-square** of position bin x index bin, with ``k = min(10, floor(sqrt(n / 5)))`` bins a
  side, so that every expected count ``n / k^2`` is at least 5 (Cochran's rule for the
  chi-square approximation). Run when ``k >= 2``, that is from 20 records.
- **last class**: the position ``t`` where the last class to appear first comes out. Under H0
  the chance that some class is still missing from the first ``t`` positions is at most
  ``sum_c C(n - n_c, t) / C(n, t)`` (union bound; exact for each class, conservative for their
  union); one-sided, since a shuffle that brings every class early is not the worry. Run with
  at least 2 classes.

The tests are combined with Bonferroni's correction: ``p = min(1, m * min_i p_i)`` for the
``m`` tests run, and an order is **not uniform** when ``p < ALPHA`` (0.001).

An order that passes is **uniform as far as these tests can see**, which says something only
when they can see the bias in question. The bias in question is the shuffle buffer the report
compares with: a buffer of ``B < n`` over the stored order has an expected rho of
:func:`expected_buffer_rho` (exact, in closed form). When that is below :attr:`Design.rho_limit`,
the smallest |rho| the rank test flags at this ``n``, the tests would miss that buffer more often
than not, and the verdict is **too small to tell**. A buffer of ``B >= n`` holds every record and
is itself a uniform shuffle; then the reference is the unshuffled order (rho = 1), and "too small
to tell" means that not even no shuffle at all could be told from a uniform one.

Determinism: every figure is a function of its arguments. No SciPy: the normal tail is
:func:`math.erfc`, its inverse :class:`statistics.NormalDist`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Literal

import numpy as np

from shardfeed.tools.shuffle_report.buffer import check_count as _check_count

__all__ = [
    "ALPHA",
    "Design",
    "Verdict",
    "chi2_bins",
    "class_counts",
    "expected_buffer_rho",
    "missing_class_p_value",
    "rho_p_value",
]

ALPHA = 1e-3  # family-wise false-alarm rate of one order's verdict
_MAX_CHI2_BINS = 10  # deciles: finer bins add little power against a buffer's band
_MIN_EXPECTED_COUNT = 5  # Cochran's rule for the chi-square approximation

Verdict = Literal["not uniform", "looks uniform", "too small to tell"]


def rho_p_value(rho: float, n: int) -> float:
    """Two-sided p-value of a Spearman ``rho`` over ``n`` positions under a uniform permutation.

    ``z = rho * sqrt(n - 1)`` against the standard normal (conservative: see the module doc).
    """
    n = _check_count("n", n, minimum=2)
    if not math.isfinite(rho) or abs(rho) > 1.0 + 1e-9:
        raise ValueError(f"rho must be a correlation in [-1, 1], got {rho}")
    return math.erfc(abs(rho) * math.sqrt(n - 1) / math.sqrt(2.0))


def chi2_bins(n: int) -> int:
    """Bins a side for the position x index chi-square over ``n`` records: at most 10, and few
    enough that every expected count ``n / k^2`` is at least 5. Below 2 the test is not run."""
    n = _check_count("n", n, minimum=0)
    return min(_MAX_CHI2_BINS, math.isqrt(n // _MIN_EXPECTED_COUNT))


def _log_choose(total: float, k: float) -> float:
    return math.lgamma(total + 1) - math.lgamma(k + 1) - math.lgamma(total - k + 1)


def missing_class_p_value(class_counts: Sequence[int], position: int) -> float:
    """Upper bound on P(some class has no record among the first ``position`` positions) under
    a uniform permutation of ``sum(class_counts)`` records: ``sum_c C(n - n_c, t) / C(n, t)``."""
    n = sum(class_counts)
    t = _check_count("position", position, minimum=0)
    if t > n:
        raise ValueError(f"position must be <= the {n} records, got {t}")
    sizes, classes = np.unique(np.asarray(class_counts, dtype=np.int64), return_counts=True)
    total = 0.0
    for count, many in zip(sizes.tolist(), classes.tolist()):  # classes of one size: one term
        if count > 0 and n - count >= t:
            total += many * math.exp(_log_choose(n - count, t) - _log_choose(n, t))
    return min(1.0, total)


def _first_position_at(class_counts: Sequence[int], p: float) -> int:
    """The smallest position ``t`` whose missing-class bound is at most ``p`` (the bound falls
    as ``t`` grows; at ``t = n - min(n_c) + 1`` every class has been seen)."""
    n = sum(class_counts)
    low, high = 0, n - min(c for c in class_counts if c > 0) + 1
    while low < high:
        middle = (low + high) // 2
        if missing_class_p_value(class_counts, middle) <= p:
            high = middle
        else:
            low = middle + 1
    return low


def expected_buffer_rho(n: int, buffer_size: int) -> float:
    """Expected Spearman rho of a shuffle buffer of ``buffer_size`` over ``n`` records in stored
    order (the order of :func:`shardfeed.tools.shuffle_report.buffer.buffer_shuffle_order`).

    Exact: record ``i`` enters the buffer at output ``s = max(0, i - B + 1)``; while input
    remains each output takes it with chance ``1/B`` (a geometric wait), and once the input is
    exhausted the last ``B`` outputs are a uniform order of what is left. So the mean squared
    displacement of every record has a closed form, and for a permutation
    ``rho = 1 - 6 sum d^2 / (n (n^2 - 1))`` is linear in it. Memory: a few arrays of ``n``.
    """
    n = _check_count("n", n, minimum=2)
    b = min(_check_count("buffer_size", buffer_size, minimum=1), n)
    i = np.arange(n, dtype=np.float64)
    start = np.maximum(0.0, i - b + 1)  # first output the record can leave at
    steps = n - b - start  # outputs before the input runs out, from `start`
    offset = start - i
    q = 1.0 - 1.0 / b
    mean_wait, var_wait = q * b, q * b * b  # geometric: failures before the first success

    def second_moment(x: np.ndarray) -> np.ndarray:  # E[(x + G)^2]
        return (x + mean_wait) ** 2 + var_wait

    still_in = np.power(q, steps)  # chance the record is left for the drain (0**0 = 1)
    drain_position = n - (b + 1) / 2.0  # mean of the drain positions n-B .. n-1
    drained = (b * b - 1) / 12.0 + (drain_position - i) ** 2
    squares = (
        second_moment(offset) - still_in * second_moment(offset + steps) + still_in * drained
    )
    return float(1.0 - 6.0 * squares.sum() / (n * (n * n - 1.0)))


@dataclass(frozen=True, slots=True)
class Design:
    """The tests one report runs on each of its orders, and how much they can see.

    ``records``: n; ``class_counts``: records of each class (empty without labels);
    ``buffer_size``: the buffer the report compares with (the reference bias).
    """

    records: int
    class_counts: tuple[int, ...]
    buffer_size: int

    def __post_init__(self) -> None:
        _check_count("records", self.records, minimum=2)
        _check_count("buffer_size", self.buffer_size, minimum=1)
        if self.class_counts and sum(self.class_counts) != self.records:
            raise ValueError(
                f"class_counts add up to {sum(self.class_counts)}, not the {self.records} "
                f"records: give the record count of every class"
            )

    @property
    def tests(self) -> tuple[str, ...]:
        """Names of the tests run: ``rho`` always, ``chi2`` from 20 records, ``last_class``
        with at least 2 classes."""
        run = ["rho"]
        if chi2_bins(self.records) >= 2:
            run.append("chi2")
        if sum(1 for c in self.class_counts if c > 0) >= 2:
            run.append("last_class")
        return tuple(run)

    @property
    def level(self) -> float:
        """The level each test is held to: ``ALPHA / m`` (Bonferroni)."""
        return ALPHA / len(self.tests)

    @property
    def rho_limit(self) -> float:
        """The smallest |rho| the rank test flags at this n (above 1: none can be flagged)."""
        z = -NormalDist().inv_cdf(self.level / 2.0)
        return z / math.sqrt(self.records - 1)

    @property
    def reference(self) -> tuple[str, float]:
        """The bias a verdict of "looks uniform" vouches for: ``("buffer", its expected rho)``
        for a buffer smaller than the data, else ``("no shuffle", 1.0)``."""
        if self.buffer_size < self.records:
            return "buffer", expected_buffer_rho(self.records, self.buffer_size)
        return "no shuffle", 1.0

    @property
    def can_tell(self) -> bool:
        """Whether the rank test alone flags the reference bias more often than not."""
        return self.reference[1] >= self.rho_limit

    def last_class_limits(self) -> dict[str, int] | None:
        """Where a uniform shuffle shows its last class first: ``typical`` (the bound reaches
        1/2) and ``limit`` (from this position on, the last-class test flags the order)."""
        if "last_class" not in self.tests:
            return None
        counts = [c for c in self.class_counts if c > 0]
        return {
            "typical": _first_position_at(counts, 0.5),
            "limit": _first_position_at(counts, self.level),
        }

    def judge(
        self, *, rho: float, chi2_p_value: float | None, latest_first_position: int | None
    ) -> tuple[Verdict, dict[str, float]]:
        """The verdict on one order and the p-values behind it: one per test run, and
        ``combined`` (Bonferroni). Figures are those of
        :func:`shardfeed.tools.shuffle_report.stats.order_stats` for the same n and labels."""
        p_values = {"rho": rho_p_value(rho, self.records)}
        if "chi2" in self.tests:
            if chi2_p_value is None:
                raise ValueError(f"a chi-square p-value is needed at {self.records} records")
            p_values["chi2"] = chi2_p_value
        if "last_class" in self.tests:
            if latest_first_position is None:
                raise ValueError("the position of the last class is needed with labels")
            counts = [c for c in self.class_counts if c > 0]
            p_values["last_class"] = missing_class_p_value(counts, latest_first_position)
        combined = min(1.0, len(p_values) * min(p_values.values()))
        p_values["combined"] = combined
        if combined < ALPHA:
            return "not uniform", p_values
        return ("looks uniform" if self.can_tell else "too small to tell"), p_values

    def to_json(self) -> dict[str, Any]:
        what, rho = self.reference
        return {
            "alpha": ALPHA,
            "tests": list(self.tests),
            "chi2_bins": chi2_bins(self.records) if "chi2" in self.tests else None,
            "rho_limit": self.rho_limit,
            "reference": what,
            "reference_rho": rho,
            "can_tell": self.can_tell,
            "latest_first_position": self.last_class_limits(),
        }


def class_counts(codes: Sequence[int] | np.ndarray, classes: int) -> tuple[int, ...]:
    """Records of each class code ``0..classes-1``."""
    return tuple(int(c) for c in np.bincount(np.asarray(codes, dtype=np.int64), minlength=classes))

