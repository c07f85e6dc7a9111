"""The shuffle report of a mixture: the proportions one epoch realises, batch by batch.

:func:`mixture_report` walks the epoch's plan (index math only: nothing is read) and counts,
for each source, its outputs in the epoch, its share of each batch, the passes over it and
the most times one record comes in one pass (1 when the mixture keeps its promise)::

    source  records  weight  outputs  share   passes  most in a pass  batch share (sd; uniform)
    0         7,000   0.700    7,000  0.700        1               1  0.700 (0.046; 0.046)

A batch's share of a source under a uniform shuffle of the epoch is hypergeometric: its
standard deviation is ``sqrt(w (1 - w) / B * (n - B) / (n - 1))``, printed beside the
measured one.

Memory: three int64 arrays of the epoch size.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from shardfeed.pipeline.mixture import Mixture
from shardfeed.pipeline.samplers import EpochContext
from shardfeed.sampling.permutation import EpochOrder

_CHUNK = 1 << 20  # positions planned at a time


def mixture_report(mixture: Mixture, *, seed: int = 0, epoch: int = 0, batch_size: int = 256,
                   shuffle: bool = True) -> dict[str, Any]:
    """What one epoch of ``mixture`` realises (JSON-able): per source ``records``,
    ``weight``, ``outputs``, ``share``, ``passes``, ``most_in_a_pass`` and the batch shares'
    ``batch_share_mean``, ``batch_share_sd``, ``batch_share_min``/``max`` beside a uniform
    shuffle's ``expected_batch_sd``; ``batches`` counts the full batches measured."""
    n = mixture.epoch_size
    order = EpochOrder(n, seed=seed, epoch=epoch, shuffle=shuffle)
    ctx = EpochContext(seed, epoch, order, n)
    sources = np.empty(n, dtype=np.int64)
    local = np.empty(n, dtype=np.int64)
    passes = np.empty(n, dtype=np.int64)  # which pass over its source each output is in
    starts = np.concatenate([[0], np.cumsum(mixture.counts)])
    sizes = np.asarray(mixture.source_sizes, dtype=np.int64)
    for start in range(0, n, _CHUNK):
        positions = np.arange(start, min(start + _CHUNK, n), dtype=np.int64)
        sources[positions], local[positions] = mixture.sources_of(ctx, positions)
        slots = np.asarray(order[positions], dtype=np.int64)
        passes[positions] = (slots - starts[sources[positions]]) // sizes[sources[positions]]
    full = n // batch_size
    rows = []
    for s, (size, weight) in enumerate(zip(mixture.source_sizes, mixture.weights)):
        mine = sources == s
        shares = mine[: full * batch_size].reshape(full, batch_size).mean(axis=1) \
            if full else np.zeros(0)
        rows.append(_source_row(s, size, weight, mine, local + passes * size, shares, n,
                                batch_size))
    return {"source": "mixture", "epoch_size": n, "seed": seed, "epoch": epoch,
            "batch_size": batch_size, "batches": full, "sources": rows}


def _source_row(s: int, size: int, weight: float, mine: np.ndarray, in_pass: np.ndarray,
                shares: np.ndarray, n: int, batch: int) -> dict[str, Any]:
    """One source's figures; ``in_pass``: each output's ``pass * size + record``."""
    outputs = int(mine.sum())
    passes = -(-outputs // size)
    most = int(np.bincount(in_pass[mine]).max()) if outputs else 0
    expected = math.sqrt(weight * (1 - weight) / batch * (n - batch) / max(n - 1, 1))
    return {
        "source": s, "records": size, "weight": weight, "outputs": outputs,
        "share": outputs / n, "passes": passes,
        "most_in_a_pass": most,
        "batch_share_mean": float(shares.mean()) if len(shares) else None,
        "batch_share_sd": float(shares.std()) if len(shares) else None,
        "batch_share_min": float(shares.min()) if len(shares) else None,
        "batch_share_max": float(shares.max()) if len(shares) else None,
        "expected_batch_sd": expected,
    }


def format_mixture(report: dict[str, Any], names: list[str] | None = None) -> str:
    """The text table of :func:`mixture_report` (``names``: one a source, in order)."""
    title = (f"mixture: {report['epoch_size']:,} outputs an epoch; seed {report['seed']}, "
             f"epoch {report['epoch']}, {report['batches']:,} full batches of "
             f"{report['batch_size']:,}")
    header = (f"  {'source':<24} {'records':>9} {'weight':>7} {'outputs':>9} {'share':>6} "
              f"{'passes':>6} {'most/pass':>9}  batch share: mean  sd (uniform)  min..max")
    lines = [title, "", header]
    for row in report["sources"]:
        name = str(row["source"]) if names is None else names[row["source"]]
        name = name if len(name) <= 24 else "\u2026" + name[-23:]
        batch = "n/a"
        if row["batch_share_mean"] is not None:
            batch = (f"{row['batch_share_mean']:.3f}  {row['batch_share_sd']:.3f} "
                     f"({row['expected_batch_sd']:.3f})  {row['batch_share_min']:.3f}.."
                     f"{row['batch_share_max']:.3f}")
        lines.append(
            f"  {name:<24} {row['records']:>9,} {row['weight']:>7.3f} {row['outputs']:>9,} "
            f"{row['share']:>6.3f} {row['passes']:>6} {row['most_in_a_pass']:>9}  {batch}")
    return "\n".join(lines)
