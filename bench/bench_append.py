"""Appending to a dataset against packing it whole: the cost of an append, and what 100 of
them leave for reading.

Data (made here, in a temporary folder): ``--records`` JPEGs of 64x48 in 10 class folders
(the dataset, packed into ``--shards`` shards), and ``--appends`` more folders of 1% of that
each (the days that come in: each append writes its own, smaller shards, with the same
records a shard). "One pack" packs all the records with that same shard size.

    pack        one pack of the dataset (``pack(folder, out)``), seconds
    append 1%   one ``pack(..., append=True)`` of 1% of it, seconds, and its share of the pack
    grown       the dataset after ``--appends`` appends of 1%, against one pack of the same
                records: opening it (``Dataset(out)``, median of 5) and a shuffled epoch of
                a Loader reading every record (no decode; 3 epochs a loader, median of 5
                interleaved loaders)
    compacted   the grown dataset after ``compact`` (its default: shards of up to 64 MB), the
                same

Targets (issue 44): an append of 1% at most 3% of the pack; after 100 appends, opening at
most 2x and shuffled reads at least 0.9x one pack's. One run::

    .venv/bin/python bench/bench_append.py [--records 20000] [--appends 100] [--shards 64]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

CLASSES = 10


def _images(folder: Path, count: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for i in range(count):
        pixels = rng.integers(0, 256, size=(48, 64, 3), dtype=np.uint8)
        path = folder / f"c{i % CLASSES}" / f"{seed}-{i}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        ok, data = cv2.imencode(".jpg", pixels)
        assert ok
        path.write_bytes(data.tobytes())


def _link_all(sources: list[Path], into: Path) -> None:
    """One folder of classes holding every image of ``sources`` (hard links)."""
    for source in sources:
        for path in source.rglob("*.jpg"):
            target = into / path.parent.name / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(path, target)


def _timed(work: object) -> float:
    start = time.perf_counter()
    work()  # type: ignore[operator]
    return time.perf_counter() - start


def _open_seconds(out: Path) -> float:
    import shardfeed

    def once() -> None:
        with shardfeed.Dataset(str(out)) as ds:
            len(ds)

    return statistics.median(_timed(once) for _ in range(5))


def _epoch_rate(out: Path, epoch: int) -> float:
    """Records/s of 3 shuffled epochs of one loader from ``epoch`` on (after its first batch:
    a pass's start is not the reads)."""
    import shardfeed

    with shardfeed.Loader(shardfeed.Dataset(str(out)), batch_size=256, shuffle=True, seed=0,
                          transform=None, num_threads=2) as loader:
        loader.set_epoch(epoch)
        batches = iter(loader)
        next(batches)
        start, count = time.perf_counter(), 0
        for _ in range(3):
            count += sum(len(b["image/class/label"]) for b in batches)
            batches = iter(loader)
        return count / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--appends", type=int, default=100)
    parser.add_argument("--shards", type=int, default=64, help="shards of the dataset")
    args = parser.parse_args(argv)

    from shardfeed.tools.pack import pack
    from shardfeed.tools.pack.compact import compact

    step = max(1, args.records // 100)
    with tempfile.TemporaryDirectory(prefix="shardfeed-append-") as tmp:
        root = Path(tmp)
        _images(root / "base", args.records, seed=0)
        days = [root / f"day{k:03d}" for k in range(args.appends)]
        for k, day in enumerate(days):
            _images(day, step, seed=k + 1)
        _link_all([root / "base", *days], root / "everything")

        size = -(-args.records // args.shards)
        whole = _timed(lambda: pack(root / "base", root / "grown", records_per_shard=size))
        appended = [_timed(lambda day=day: pack(day, root / "grown", append=True,
                                                records_per_shard=size)) for day in days]
        once = _timed(lambda: pack(root / "everything", root / "one", records_per_shard=size))
        first = appended[0]
        print(f"{args.records:,} records of 64x48 JPEGs, {CLASSES} classes, {size:,} a shard; "
              f"{platform.machine()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
        print(f"pack            {whole:8.2f} s")
        print(f"append 1%       {first:8.3f} s  ({first / whole:.1%} of the pack; median of "
              f"{len(appended)}: {statistics.median(appended):.3f} s, last "
              f"{appended[-1]:.3f} s)")
        print(f"pack of all     {once:8.2f} s  ({args.records + step * args.appends:,} records)")

        shutil.copytree(root / "grown", root / "compacted", symlinks=True)
        squeezed = _timed(lambda: compact(root / "compacted", target=64 << 20))  # its default
        names = ("grown", "compacted", "one")
        opened = {k: _open_seconds(root / k) for k in names}
        rates: dict[str, list[float]] = {k: [] for k in names}
        for epoch in range(5):
            for name, found in rates.items():
                found.append(_epoch_rate(root / name, epoch))
        rate = {k: statistics.median(v) for k, v in rates.items()}
        print(f"compact         {squeezed:8.2f} s  (the grown dataset's small shards merged)")
        for name in ("grown", "compacted"):
            print(f"open {name:<10} {opened[name] * 1e3:7.1f} ms, one pack "
                  f"{opened['one'] * 1e3:7.1f} ms ({opened[name] / opened['one']:.2f}x)")
        for name in ("grown", "compacted"):
            print(f"epoch {name:<9} {rate[name]:9,.0f} records/s, one pack "
                  f"{rate['one']:9,.0f} ({rate[name] / rate['one']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
