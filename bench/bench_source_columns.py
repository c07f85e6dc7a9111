"""A data source that declares ``read_columns`` (``shardfeed.ReadsColumns``) against the same
source without it: images/s through the Loader, 28x28 grey images and int labels held in
memory (docs/extending.md's ``Arrays``), no transform and ``Normalize``, batch 256.

    python bench/bench_source_columns.py [--images 60000] [--threads 2] [--rounds 5]

Prints the median of interleaved rounds per (source, transform) and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

import shardfeed
from shardfeed.transforms import Normalize


class Arrays(shardfeed.DataSourceBase):
    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.images)

    def read_many(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        return [{"image": self.images[i], "label": self.labels[i]} for i in indices]

    @property
    def fingerprint(self) -> str:
        return f"arrays:{len(self.images)}"


class ArrayColumns(Arrays):
    def read_columns(self, indices: Sequence[int] | np.ndarray, *,
                     into: Any = None) -> dict[str, Any] | None:
        idx = np.asarray(indices, dtype=np.int64)
        return {"image": self.images[idx], "label": self.labels[idx]}


def epoch_rate(source: Any, transform: Any, threads: int) -> float:
    with shardfeed.Loader(source, batch_size=256, seed=0, num_threads=threads,
                          transform=transform, drop_last=True) as loader:
        for _ in zip(range(4), loader):  # warm
            pass
        loader.set_epoch(1)
        start, count = time.perf_counter(), 0
        for batch in loader:
            count += len(batch["image"])
        return count / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--images", type=int, default=60_000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (args.images, 28, 28, 1), dtype=np.uint8)
    labels = rng.integers(0, 10, args.images).astype(np.int64)
    cases = {(name, tname): (source, transform)
             for name, source in (("read_many", Arrays(images, labels)),
                                  ("read_columns", ArrayColumns(images, labels)))
             for tname, transform in (("none", None), ("Normalize", Normalize(0.5, 0.25)))}
    rates: dict[tuple[str, str], list[float]] = {key: [] for key in cases}
    for _ in range(args.rounds):
        for key, (source, transform) in cases.items():
            rates[key].append(epoch_rate(source, transform, args.threads))
    print(f"{args.images} images 28x28x1 in memory, batch 256, {args.threads} threads, "
          f"median of {args.rounds} interleaved rounds (images/s)")
    for tname in ("none", "Normalize"):
        slow = statistics.median(rates[("read_many", tname)])
        fast = statistics.median(rates[("read_columns", tname)])
        print(f"  transform {tname:<9}  read_many {slow:>10,.0f}   read_columns {fast:>10,.0f}"
              f"   {fast / slow:5.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
