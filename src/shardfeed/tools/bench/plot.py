"""The ``bench --plot`` pictures: throughput over time, with the decode limit beside it; and
where the loader's threads spent that time, stage by stage.

matplotlib is imported when the plot is drawn, through its object API with the Agg canvas
(no pyplot, no change to the caller's backend). Determinism: the picture is a function of the
result dict. Memory: one small figure.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["plot_stages", "plot_throughput", "stages_path"]

_UNITS = {"records": "images/s", "windows": "windows/s", "patches": "patches/s"}


def plot_throughput(result: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Draw ``result["timeline"]`` (samples/s over seconds since the first batch) as a PNG.

    The warm-up is shaded; the measured mean and, for records, the decode limit of the same
    files are drawn as horizontal lines. Returns the path written.
    """
    from matplotlib.figure import Figure

    timeline = result.get("timeline") or []
    kind = str(result.get("kind", "records"))
    unit = _UNITS.get(kind, "samples/s")
    fig = Figure(figsize=(8.0, 4.2), dpi=100, layout="constrained")
    ax = fig.subplots()
    if timeline:
        t = [row[0] for row in timeline]
        rate = [row[1] for row in timeline]
        ax.step(t, rate, where="post", color="#2166ac", label=f"loader ({unit})")
        warmup = float(result.get("warmup_seconds") or 0.0)
        if warmup > 0:
            ax.axvspan(0, min(warmup, t[-1]), color="#dddddd", alpha=0.6, label="warm-up")
    mean = result.get("samples_per_s")
    if mean:
        ax.axhline(mean, color="#2166ac", linestyle="--", linewidth=1,
                   label=f"measured mean {mean:,.0f} {unit}")
    limit = result.get("decode_limit")
    if limit and kind == "records":
        ax.axhline(limit["images_per_s"], color="#b2182b", linestyle=":", linewidth=1.5,
                   label=f"decode limit {limit['images_per_s']:,.0f} images/s "
                         f"({limit['threads']} threads)")
    elif limit and kind == "windows":
        per_window = max(1, int(result.get("windows") or 1))
        ax.axhline(limit["images_per_s"] / per_window, color="#b2182b", linestyle=":",
                   linewidth=1.5, label=f"decode limit / {per_window} frames")
    ax.set_xlabel("seconds since the first batch")
    ax.set_ylabel(unit)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    source = os.path.basename(str(result.get("source", "")).rstrip("/")) or "dataset"
    ax.set_title(
        f"shardfeed bench: {source}, {kind}, preset {result.get('preset')}, "
        f"batch {result.get('batch_size')}, {result.get('threads')} threads"
    )
    ax.legend(loc="best", fontsize=8, framealpha=0.9)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, format="png")
    return target


_STAGE_COLOURS = {"read": "#92c5de", "decode": "#2166ac", "transform": "#f4a582",
                  "assemble": "#b2182b"}


def stages_path(path: str | os.PathLike[str]) -> Path:
    """The stage plot's file beside the throughput plot's: ``NAME-stages.png``."""
    target = Path(path)
    return target.with_name(f"{target.stem}-stages{target.suffix or '.png'}")


def plot_stages(result: Mapping[str, Any], path: str | os.PathLike[str]) -> Path | None:
    """Draw ``result["stage_timeline"]`` as a PNG: for each window of the measured stretch
    (``[start, end, {stage: threads busy}]``),
    how many threads were, on average, in each stage (stacked), against the threads there
    are. None (nothing written) without a timeline. Returns the path written."""
    timeline = result.get("stage_timeline") or []
    if not timeline:
        return None
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.0, 4.2), dpi=100, layout="constrained")
    ax = fig.subplots()
    # each window a step from its start to its end
    t = [row[0] for row in timeline] + [timeline[-1][1]]
    names = [n for n in _STAGE_COLOURS if any(row[2].get(n) for row in timeline)]
    ax.stackplot(t, *[[row[2].get(n, 0.0) for row in timeline] + [timeline[-1][2].get(n, 0.0)]
                      for n in names],
                 labels=names, colors=[_STAGE_COLOURS[n] for n in names], step="post")
    threads = result.get("threads")
    if threads:
        ax.axhline(threads, color="black", linestyle=":", linewidth=1,
                   label=f"{threads} thread{'s' if threads != 1 else ''}")
    stages = result.get("stages") or {}
    shares = stages.get("shares") or {}
    top = max(names, key=lambda n: shares.get(n, 0.0)) if names else None
    ax.set_xlabel("seconds since the measured stretch began")
    ax.set_ylabel("threads busy in each stage")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    source = os.path.basename(str(result.get("source", "")).rstrip("/")) or "dataset"
    ax.set_title(f"shardfeed bench: {source}, where the threads' time went"
                 + (f" ({top} {shares.get(top, 0.0):.0%})" if top else ""))
    ax.legend(loc="best", fontsize=8, framealpha=0.9)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, format="png")
    return target
