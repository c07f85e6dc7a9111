"""How random is an order? Statistics of orders, measured against a uniform permutation.

An *order* is a 1-D integer array: ``order[p]`` is the record index emitted at output position
``p`` of one epoch. :func:`order_stats` gives Spearman rho of position vs index, mean absolute
displacement, chi-square of position bin x index bin with its p-value (up to deciles, as many
bins as keep every expected count at 5 or more; none below 20 records), first position of
each label and the mean number of distinct labels per batch. What they say about the order is
decided in :mod:`shardfeed.tools.shuffle_report.verdict`.

The orders of a shuffle buffer come from :mod:`shardfeed.tools.shuffle_report.buffer`; its functions
(:func:`buffer_shuffle_order`, :func:`file_shuffle_buffer_order`, :func:`buffer_draws`,
:func:`simulate_buffer`) are re-exported here.

Everything is vectorised NumPy: a million records take a fraction of a second per order.
No SciPy: the chi-square survival function is computed here from the regularised gamma function.

Determinism: every statistic is a function of its arguments alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from shardfeed.tools.shuffle_report.buffer import (
    IntArray,
    buffer_draws,
    buffer_shuffle_order,
    file_shuffle_buffer_order,
    simulate_buffer,
)
from shardfeed.tools.shuffle_report.buffer import check_count as _check_count
from shardfeed.tools.shuffle_report.verdict import chi2_bins

__all__ = [
    "ChiSquare",
    "OrderStats",
    "buffer_draws",
    "buffer_shuffle_order",
    "chi2_sf",
    "decile_chi2",
    "expected_labels_per_batch",
    "file_shuffle_buffer_order",
    "label_first_positions",
    "mean_abs_displacement",
    "mean_labels_per_batch",
    "order_stats",
    "simulate_buffer",
    "spearman_rho",
]


def _as_order(order: npt.ArrayLike, num_records: int | None) -> tuple[IntArray, int]:
    o = np.asarray(order)
    if o.ndim != 1 or not np.issubdtype(o.dtype, np.integer):
        raise TypeError(
            f"order must be a 1-D integer array of record indices, got shape {o.shape} {o.dtype}"
        )
    if o.size < 2:
        raise ValueError(f"order must hold at least 2 positions to be measured, got {o.size}")
    o = o.astype(np.int64, copy=False)
    low, high = int(o.min()), int(o.max())
    n = high + 1 if num_records is None else _check_count("num_records", num_records, minimum=1)
    if low < 0 or high >= n:
        raise ValueError(
            f"order holds record indices in [{low}, {high}], outside [0, {n}): "
            f"pass num_records = the number of records the indices refer to"
        )
    return o, n


def _ranks(values: IntArray) -> npt.NDArray[np.float64]:
    """Ranks 0..n-1 with ties given their average rank (values of a permutation are their own)."""
    n = values.size
    is_permutation = (
        int(values.min()) == 0
        and int(values.max()) == n - 1
        and bool(np.all(np.bincount(values, minlength=n) == 1))
    )
    if is_permutation:
        return values.astype(np.float64)
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    average = first + (counts - 1) / 2.0
    return np.asarray(average[inverse], dtype=np.float64)


def spearman_rho(order: npt.ArrayLike) -> float:
    """Spearman rank correlation of output position vs record index.

    1 = stored order, -1 = reversed, about 0 (within a few ``1/sqrt(n)``) for a uniform shuffle.
    Ties in the indices (an order that repeats records) get average ranks.
    """
    o, _ = _as_order(order, None)
    ranks = _ranks(o)
    positions = np.arange(o.size, dtype=np.float64)
    positions -= positions.mean()
    ranks -= ranks.mean()
    denominator = math.sqrt(float(positions @ positions) * float(ranks @ ranks))
    return 0.0 if denominator == 0.0 else float(positions @ ranks) / denominator


def mean_abs_displacement(order: npt.ArrayLike, *, num_records: int | None = None) -> float:
    """Mean of ``|position - index| / n`` (position scaled to the record range if the order is
    shorter or longer than ``num_records``). 0 = stored order, about 1/3 for a uniform shuffle,
    about 1/2 for the reversed order.
    """
    o, n = _as_order(order, num_records)
    scaled = np.arange(o.size, dtype=np.float64) * (n / o.size)
    return float(np.mean(np.abs(scaled - o)) / n)


@dataclass(frozen=True, slots=True)
class ChiSquare:
    """A chi-square test of independence on a contingency table."""

    statistic: float
    dof: int
    p_value: float


def _regularised_upper_gamma(a: float, x: float) -> float:
    """Q(a, x) = Gamma(a, x) / Gamma(a): series below ``a + 1``, continued fraction above."""
    if x <= 0.0:
        return 1.0
    log_front = -x + a * math.log(x) - math.lgamma(a)
    eps, tiny = 1e-15, 1e-300
    if x < a + 1.0:
        # P(a, x) = x^a e^-x / Gamma(a) * sum_k x^k / (a (a+1) ... (a+k))
        term = total = 1.0 / a
        denominator = a
        for _ in range(100_000):
            denominator += 1.0
            term *= x / denominator
            total += term
            if abs(term) < abs(total) * eps:
                break
        return max(0.0, 1.0 - total * math.exp(log_front))
    # Continued fraction for Q(a, x), evaluated by the modified Lentz method.
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 100_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        step = d * c
        h *= step
        if abs(step - 1.0) < eps:
            break
    return h * math.exp(log_front) if log_front > -745.0 else 0.0


def chi2_sf(statistic: float, dof: int) -> float:
    """Survival function of the chi-square distribution: P(X >= statistic) for ``dof`` degrees."""
    dof = _check_count("dof", dof, minimum=1)
    if not math.isfinite(statistic):
        raise ValueError(f"statistic must be finite, got {statistic}")
    return _regularised_upper_gamma(dof / 2.0, max(statistic, 0.0) / 2.0)


def decile_chi2(
    order: npt.ArrayLike, *, num_records: int | None = None, bins: int = 10
) -> ChiSquare:
    """Chi-square test of independence of position decile and record-index decile.

    A uniform shuffle puts every index decile equally in every position decile; a buffer keeps
    late indices out of early positions. A small p-value (< 0.001) means the order is not a
    uniform shuffle. Empty rows or columns (fewer records than bins) are dropped.
    """
    o, n = _as_order(order, num_records)
    bins = _check_count("bins", bins, minimum=2)
    position_bin = np.arange(o.size, dtype=np.int64) * bins // o.size
    index_bin = o * bins // n
    table = np.bincount(position_bin * bins + index_bin, minlength=bins * bins)
    table = table.reshape(bins, bins).astype(np.float64)
    table = table[table.sum(axis=1) > 0][:, table.sum(axis=0) > 0]
    rows, cols = table.shape
    dof = (rows - 1) * (cols - 1)
    if dof == 0:
        return ChiSquare(statistic=0.0, dof=0, p_value=1.0)
    expected = np.outer(table.sum(axis=1), table.sum(axis=0)) / table.sum()
    statistic = float(np.sum((table - expected) ** 2 / expected))
    return ChiSquare(statistic=statistic, dof=dof, p_value=chi2_sf(statistic, dof))


def _labels_in_order(order: npt.ArrayLike, labels: npt.ArrayLike) -> npt.NDArray[Any]:
    lab = np.asarray(labels)
    if lab.ndim != 1:
        raise TypeError(f"labels must be 1-D (one label per record), got shape {lab.shape}")
    o, _ = _as_order(order, lab.size)
    return lab[o]


def label_first_positions(order: npt.ArrayLike, labels: npt.ArrayLike) -> dict[Any, int]:
    """First output position of each label; ``labels[i]`` is the label of record ``i``.

    Labels of ``labels`` that the order never emits map to -1. Under a uniform shuffle of ``n``
    records every class of ``n_c`` records appears by about position ``n / n_c``; under a buffer
    over sorted labels the last class waits until the buffer reaches it.
    """
    at = _labels_in_order(order, labels)
    classes = np.unique(np.asarray(labels))
    present, first = np.unique(at, return_index=True)
    positions = np.full(classes.size, -1, dtype=np.int64)
    positions[np.searchsorted(classes, present)] = first
    return {c.item(): int(p) for c, p in zip(classes, positions)}


def mean_labels_per_batch(order: npt.ArrayLike, labels: npt.ArrayLike, batch_size: int) -> float:
    """Mean number of distinct labels in a batch of ``batch_size`` consecutive positions.

    Full batches only (the last partial batch is left out unless it is the only one).
    """
    batch_size = _check_count("batch_size", batch_size, minimum=1)
    at = _labels_in_order(order, labels)
    full = at.size // batch_size
    batches = at[: full * batch_size].reshape(full, batch_size) if full else at.reshape(1, -1)
    ordered = np.sort(batches, axis=1)
    distinct = 1 + np.count_nonzero(ordered[:, 1:] != ordered[:, :-1], axis=1)
    return float(distinct.mean())


def expected_labels_per_batch(labels: npt.ArrayLike, batch_size: int) -> float:
    """Mean distinct labels per batch under a uniform shuffle: ``sum_c 1 - C(n-n_c, b)/C(n, b)``."""
    batch_size = _check_count("batch_size", batch_size, minimum=1)
    _, counts = np.unique(np.asarray(labels), return_counts=True)
    n = int(counts.sum())
    b = min(batch_size, n)

    def log_choose(total: int, k: int) -> float:
        return math.lgamma(total + 1) - math.lgamma(k + 1) - math.lgamma(total - k + 1)

    expected = 0.0
    for count in counts.tolist():
        if n - count < b:
            expected += 1.0
        else:
            expected += 1.0 - math.exp(log_choose(n - count, b) - log_choose(n, b))
    return expected


@dataclass(frozen=True, slots=True)
class OrderStats:
    """Statistics of one order (see :func:`order_stats`); ``to_json()`` gives plain types.

    Label fields are None when no labels were given; ``chi2`` is None below 20 records (too
    few for the chi-square approximation). ``latest_label`` is the label whose first
    appearance comes last and ``latest_first_position`` that position.
    """

    records: int
    spearman_rho: float
    mean_abs_displacement: float
    chi2: ChiSquare | None
    label_first_positions: dict[Any, int] | None = None
    latest_label: Any = None
    latest_first_position: int | None = None
    mean_labels_per_batch: float | None = None

    def to_json(self) -> dict[str, Any]:
        firsts = self.label_first_positions
        return {
            "records": self.records,
            "spearman_rho": self.spearman_rho,
            "mean_abs_displacement": self.mean_abs_displacement,
            "chi2": None if self.chi2 is None else self.chi2.statistic,
            "chi2_dof": None if self.chi2 is None else self.chi2.dof,
            "chi2_p_value": None if self.chi2 is None else self.chi2.p_value,
            "label_first_positions": (
                None if firsts is None else {str(k): v for k, v in firsts.items()}
            ),
            "latest_label": None if self.latest_label is None else str(self.latest_label),
            "latest_first_position": self.latest_first_position,
            "mean_labels_per_batch": self.mean_labels_per_batch,
        }


def order_stats(
    order: npt.ArrayLike,
    *,
    labels: npt.ArrayLike | None = None,
    batch_size: int = 256,
    num_records: int | None = None,
) -> OrderStats:
    """All statistics of one order; label statistics only when ``labels`` (one per record) given.

    The chi-square uses :func:`shardfeed.tools.shuffle_report.verdict.chi2_bins` bins a side.
    """
    if labels is not None:
        count = np.asarray(labels).shape[0] if np.ndim(labels) else 0
        if num_records is not None and num_records != count:
            raise ValueError(
                f"num_records={num_records} but labels holds {count} labels: "
                f"give one label per record"
            )
        num_records = count
    o, n = _as_order(order, num_records)
    rho = spearman_rho(o)
    displacement = mean_abs_displacement(o, num_records=n)
    bins = chi2_bins(o.size)
    chi2 = decile_chi2(o, num_records=n, bins=bins) if bins >= 2 else None
    if labels is None:
        return OrderStats(o.size, rho, displacement, chi2)
    firsts = label_first_positions(o, labels)
    emitted = {k: v for k, v in firsts.items() if v >= 0}
    latest = max(emitted, key=lambda k: emitted[k]) if emitted else None
    return OrderStats(
        o.size,
        rho,
        displacement,
        chi2,
        label_first_positions=firsts,
        latest_label=latest,
        latest_first_position=None if latest is None else emitted[latest],
        mean_labels_per_batch=mean_labels_per_batch(o, labels, batch_size),
    )
