"""Pictures of orders: position vs record index, and label vs position.

One panel per order (for example shardfeed's exact shuffle, a shuffle buffer, shard shuffle +
buffer), side by side with the same axes, so the bias of a buffer is visible at a glance: its
points hug the diagonal, and over label-sorted data whole classes are missing from the early
positions.

matplotlib is imported when a plot is drawn, never at import time, and only through its
object API with the Agg canvas: no pyplot, no change to the caller's backend or global state.
Large orders are drawn from evenly spaced positions (``max_points`` per panel).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from shardfeed.tools.shuffle_report.stats import label_first_positions, spearman_rho

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["plot_label_vs_position", "plot_position_vs_index"]

_COLOURS = ("#1b7837", "#b2182b", "#d6604d", "#2166ac", "#762a83")


def _figure(panels: int) -> tuple[Figure, list[Any]]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.6 * panels + 0.6, 4.6), dpi=100, layout="constrained")
    axes = fig.subplots(1, panels, sharex=True, sharey=True, squeeze=False)[0]
    for ax in axes:
        ax.xaxis.set_major_formatter(_formatter())
    return fig, list(axes)


def _formatter() -> Any:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(_compact)


def _compact(value: float, _position: object = None) -> str:
    """Axis numbers as 0, 250k, 1.5M: short enough not to collide between panels."""
    if abs(value) >= 1e6:
        return f"{value / 1e6:g}M"
    if abs(value) >= 1e3:
        return f"{value / 1e3:g}k"
    return f"{value:g}"


def _sample_positions(length: int, max_points: int) -> npt.NDArray[np.int64]:
    if max_points < 1:
        raise ValueError(f"max_points must be >= 1, got {max_points}")
    if length <= max_points:
        return np.arange(length, dtype=np.int64)
    return np.unique(np.linspace(0, length - 1, max_points).astype(np.int64))


def _check_orders(orders: Mapping[str, npt.ArrayLike]) -> dict[str, npt.NDArray[np.int64]]:
    if not orders:
        raise ValueError("orders is empty: pass a mapping of name -> order array")
    checked = {}
    for name, order in orders.items():
        array = np.asarray(order)
        if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer) or array.size < 2:
            raise TypeError(
                f"order {name!r} must be a 1-D integer array of at least 2 record indices, "
                f"got shape {array.shape} {array.dtype}"
            )
        checked[name] = array.astype(np.int64, copy=False)
    return checked


def _save(fig: Figure, path: str | os.PathLike[str]) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, format="png")
    return target


def plot_position_vs_index(
    orders: Mapping[str, npt.ArrayLike],
    path: str | os.PathLike[str],
    *,
    max_points: int = 20_000,
) -> Path:
    """Scatter of record index against output position, one panel per order; writes a PNG.

    A uniform shuffle fills the square evenly; a shuffle buffer stays in a band along the
    diagonal (no record can come out before the buffer has read it). Titles give Spearman rho.
    Returns the path written.
    """
    checked = _check_orders(orders)
    fig, axes = _figure(len(checked))
    for i, (ax, (name, order)) in enumerate(zip(axes, checked.items())):
        shown = _sample_positions(order.size, max_points)
        ax.scatter(
            shown, order[shown], s=1.5, alpha=0.5, linewidths=0, color=_COLOURS[i % len(_COLOURS)],
            label=f"records ({shown.size:,} of {order.size:,} shown)", rasterized=True,
        )
        top = max(order.size, int(order.max()) + 1)
        ax.plot([0, order.size], [0, top], "k--", linewidth=0.8, label="stored order")
        ax.set_title(f"{name}\nSpearman \u03c1 = {spearman_rho(order):+.3f}")
        ax.set_xlabel("output position in the epoch")
        ax.legend(loc="upper left", fontsize="small", markerscale=6, framealpha=0.9)
        ax.set_xlim(0, order.size)
        ax.set_ylim(0, top)
    axes[0].set_ylabel("record index (stored order)")
    axes[0].yaxis.set_major_formatter(_formatter())
    fig.suptitle("Where each record comes out: position vs stored index")
    return _save(fig, path)


def plot_label_vs_position(
    orders: Mapping[str, npt.ArrayLike],
    labels: npt.ArrayLike,
    path: str | os.PathLike[str],
    *,
    class_names: Sequence[str] | None = None,
    max_points: int = 20_000,
) -> Path:
    """The label of the record at each output position, one panel per order; writes a PNG.

    ``labels`` are integer class codes, one per record (``class_names[code]`` names them on the
    axis when there are few classes). Points are jittered vertically within their class row. A
    dotted line marks where the last class to appear first comes out. Returns the path written.
    """
    checked = _check_orders(orders)
    codes = np.asarray(labels)
    if codes.ndim != 1 or not np.issubdtype(codes.dtype, np.integer):
        raise TypeError(
            f"labels must be 1-D integer class codes, got shape {codes.shape} {codes.dtype}"
        )
    classes = int(codes.max()) + 1 if codes.size else 0
    jitter = np.random.Generator(np.random.Philox(0)).uniform(-0.35, 0.35, size=max_points)
    fig, axes = _figure(len(checked))
    for i, (ax, (name, order)) in enumerate(zip(axes, checked.items())):
        shown = _sample_positions(order.size, max_points)
        ax.scatter(
            shown, codes[order[shown]] + jitter[: shown.size], s=1.5, alpha=0.5, linewidths=0,
            color=_COLOURS[i % len(_COLOURS)], rasterized=True,
            label=f"records ({shown.size:,} of {order.size:,} shown)",
        )
        firsts = {k: v for k, v in label_first_positions(order, codes).items() if v >= 0}
        latest = max(firsts, key=lambda k: firsts[k])
        first = firsts[latest]
        ax.axvline(first, color="k", linestyle=":", linewidth=1.0,
                   label=f"last class first seen at {first:,}")
        ax.set_title(f"{name}\nSpearman \u03c1 = {spearman_rho(order):+.3f}")
        ax.set_xlabel("output position in the epoch")
        ax.legend(loc="upper left", fontsize="small", markerscale=6, framealpha=0.9)
        ax.set_xlim(0, order.size)
        ax.set_ylim(-0.5, max(classes, 1) - 0.5)
    axes[0].set_ylabel("label of the record at that position")
    if class_names is not None and len(class_names) <= 20:
        axes[0].set_yticks(range(len(class_names)), [str(c) for c in class_names])
    fig.suptitle("Which classes come out when: label vs position")
    return _save(fig, path)
