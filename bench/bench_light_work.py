"""Light work on many threads: img/s at 1 and N threads, and the GIL-held share of slice time.

Light per-sample work (small images, patch crops) scales with threads only as far as the
slice builders leave the GIL free. On a 2-core machine the 16-core figure cannot be measured,
but the share ``g`` of a slice's wall time during which its thread holds the GIL predicts it
(Amdahl): ``T`` threads give at most ``1 / (g + (1 - g) / T)`` times the one-thread rate.
This script measures both, on three sets built once under ``--data``:

- ``png28``: 28x28 grey digits packed from arrays (PNG records), ``DecodeImage(channels="gray")``,
  batch 256 (the node bench's set, ``bench_node.make_png28``);
- ``raw28``: the same arrays packed with ``RowFields(encode="raw")``, same transform;
- ``patches``: ``Patches(size=32, cache_images=64, refresh_every=100)`` over 1566x1566
  q90 JPEGs (``bench_node.make_jpegs``), batch 256, no transform.

Rates: one loader a (set, threads) with every thread held (``adaptive_threads=False``),
warmed up, then ``--repeats`` windows of about ``--window`` seconds in interleaved rounds;
the table gives medians. ``g (2T)`` is the share the two-thread speed-up implies
(``2 / S2 - 1``, Amdahl solved for g; noisy on a loaded machine).

GIL share (``--gil``, needs ``py-spy``): a child process runs the one-thread loader for
``--gil-seconds`` under ``py-spy record`` twice, once with ``--gil`` (samples of threads
holding the GIL) and once with ``--idle`` (every sample); ``g`` is the samples inside
``build_slice`` of the first over those of the second. The GIL-held frames that weigh most
are listed (the per-sample Python hot spots).

    python bench/bench_light_work.py [--data /tmp/lw] [--repeats 5] [--threads 1 2] [--gil]
                                     [--sets png28 raw28 patches] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

SETS = ("png28", "raw28", "patches")
BATCH = 256
PNG_COUNT = 30_000
BIG_IMAGES = 80
BIG_SIDE = 1566


# -- data ---------------------------------------------------------------------------------------


def build(data: Path) -> dict[str, Path]:
    """The three sets under ``data`` (made once; a folder that exists is kept)."""
    from bench_node import make_jpegs, make_png28, write_jpeg_shards

    from shardfeed.dataset import Dataset
    from shardfeed.tools.pack import pack
    from shardfeed.tools.pack.rows import RowFields

    data.mkdir(parents=True, exist_ok=True)
    png = data / "png28"
    if not (png / "shardfeed.json").exists():
        make_png28(png, PNG_COUNT)
    raw = data / "raw28"
    if not (raw / "shardfeed.json").exists():
        with Dataset(str(png)) as ds:
            records = ds.read_many(list(range(len(ds))))
        import cv2

        pixels = np.stack([cv2.imdecode(np.frombuffer(r["image/encoded"], np.uint8),
                                        cv2.IMREAD_GRAYSCALE) for r in records])[..., None]
        labels = np.array([int(r["label"][0]) if "label" in r else
                           int(r["image/class/label"][0]) for r in records], np.int64)
        pack((pixels, labels), str(raw), records_per_shard=5000, overwrite=True,
             fields=RowFields(encode="raw"))
    big = data / "big"
    if not big.exists():
        jpegs = make_jpegs(BIG_IMAGES, BIG_SIDE, BIG_SIDE, threads=os.cpu_count() or 1, seed=11)
        write_jpeg_shards(big, jpegs, BIG_SIDE, BIG_SIDE, shards=2, files=False)
    return {"png28": png, "raw28": raw, "patches": big}


# -- loaders ------------------------------------------------------------------------------------


def open_loader(name: str, folder: Path, threads: int) -> tuple[Any, Any]:
    """(dataset, loader) of set ``name`` with ``threads`` threads, every one held."""
    from shardfeed.dataset import Dataset
    from shardfeed.pipeline import Loader
    from shardfeed.transforms import DecodeImage

    ds = Dataset(str(folder))
    source: Any = ds
    transform: Any = DecodeImage(channels="gray")
    if name == "patches":
        from shardfeed.pipeline.patches import Patches

        source = Patches(ds, size=32, cache_images=64, refresh_every=100)
        transform = None
    loader = Loader(source, batch_size=BATCH, shuffle=True, seed=0, transform=transform,
                    num_threads=threads, prefetch_batches=4, drop_last=True,
                    adaptive_threads=False)
    return ds, loader


def endless(loader: Any) -> Iterator[int]:
    epoch = 0
    while True:
        loader.set_epoch(epoch)
        for batch in loader:
            yield len(batch["image"])
        epoch += 1


def window(batches: Iterator[int], seconds: float) -> tuple[float, float]:
    """(items/s, CPU µs an item: every thread of this process, less distorted by load from
    other processes than wall time) over about ``seconds``."""
    items, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        items += next(batches)
    return (items / (time.perf_counter() - start),
            (time.process_time() - cpu) / max(1, items) * 1e6)


# -- GIL share ------------------------------------------------------------------------------------


def child(args: argparse.Namespace) -> None:
    """Run the one-thread loader of ``args.child`` for ``args.gil_seconds`` (under py-spy)."""
    folders = build(Path(args.data))
    if args.gil_slice:  # each of T threads builds batch / T samples at once: that slice
        from shardfeed.pipeline.options import LoaderOptions

        LoaderOptions.slice_size = lambda self: args.gil_slice  # type: ignore[method-assign]
    ds, loader = open_loader(args.child, folders[args.child], 1)
    with ds, loader:
        batches = endless(loader)
        for _ in range(4):
            next(batches)
        end = time.perf_counter() + args.gil_seconds
        while time.perf_counter() < end:
            next(batches)


def _spy(args: argparse.Namespace, name: str, flag: str) -> list[tuple[list[str], int]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "raw.txt"
        cmd = [args.py_spy, "record", flag, "-r", "250", "-f", "raw", "-o", str(out), "--",
               sys.executable, __file__, "--data", args.data, "--child", name,
               "--gil-seconds", str(args.gil_seconds), "--gil-slice", str(args.gil_slice)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stacks = []
        for line in out.read_text().splitlines():
            frames, _, count = line.rpartition(" ")
            if frames:
                stacks.append((frames.split(";"), int(count)))
        return stacks


def gil_share(args: argparse.Namespace, name: str) -> dict[str, Any]:
    """``g`` of set ``name`` and the GIL-held frames (leaf functions) that weigh most."""
    held = [(f, n) for f, n in _spy(args, name, "--gil") if _in_slice(f)]
    every = [(f, n) for f, n in _spy(args, name, "--idle") if _in_slice(f)]
    held_n = sum(n for _, n in held)
    every_n = sum(n for _, n in every)
    leaves: collections.Counter[str] = collections.Counter()
    for frames, n in held:
        leaves[frames[-1].split(" (")[0] + " (" + frames[-1].rsplit("/", 1)[-1]] += n
    top = [(leaf, n / max(1, every_n)) for leaf, n in leaves.most_common(8)]
    return {"g": held_n / max(1, every_n), "held": held_n, "samples": every_n, "top": top}


def _in_slice(frames: list[str]) -> bool:
    return any(f.split(" (")[0].endswith("build_slice") for f in frames)


# -- main ---------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="/tmp/lw")
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--window", type=float, default=1.0, help="seconds a timed window")
    parser.add_argument("--gil", action="store_true", help="also measure g with py-spy")
    parser.add_argument("--gil-seconds", type=float, default=6.0)
    parser.add_argument("--gil-slice", type=int, default=BATCH // 16,
                        help="samples a slice while g is measured (default: batch / 16, the "
                        "slice of each of 16 threads; 0: the loader's own, batch / 1)")
    parser.add_argument("--py-spy", default=str(Path(sys.executable).parent / "py-spy"))
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    folders = build(Path(args.data))
    open_: dict[tuple[str, int], tuple[Any, Any, Iterator[int]]] = {}
    rates: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
    cpus: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
    try:
        for name in args.sets:
            for threads in args.threads:
                ds, loader = open_loader(name, folders[name], threads)
                batches = endless(loader)
                for _ in range(3 if name != "patches" else 6):
                    next(batches)
                open_[name, threads] = (ds, loader, batches)
        for _ in range(args.repeats):  # interleaved rounds
            for key, (_, _, batches) in open_.items():
                rate, cpu = window(batches, args.window)
                rates[key].append(rate)
                cpus[key].append(cpu)
    finally:
        for ds, loader, _ in open_.values():
            loader.close()
            ds.close()
    gil = {name: gil_share(args, name) for name in args.sets} if args.gil else {}
    result: dict[str, Any] = {"cores": os.cpu_count(), "sets": {}}
    print(f"\n{os.cpu_count()} cores, batch {BATCH}, every thread held; medians of "
          f"{args.repeats} windows of {args.window:g} s")
    head = " | ".join(f"{t} thread{'s' if t > 1 else ''} img/s" for t in args.threads)
    cpu_head = " | ".join(f"CPU µs/img ({t})" for t in args.threads)
    print(f"| set | {head} | {cpu_head} | g (2T) | g (py-spy) | 16 cores by g |")
    print("|---" * (2 * len(args.threads) + 4) + "|")
    for name in args.sets:
        med = {t: statistics.median(rates[name, t]) for t in args.threads}
        g2 = None
        if 1 in med and 2 in med:
            g2 = min(1.0, max(0.0, 2 * med[1] / med[2] - 1))
        g = gil.get(name, {}).get("g")
        ceiling = None if g is None else 1 / (g + (1 - g) / 16)
        cpu = {t: statistics.median(cpus[name, t]) for t in args.threads}
        cells = " | ".join([*(f"{med[t]:,.0f}" for t in args.threads),
                            *(f"{cpu[t]:.2f}" for t in args.threads)])
        print(f"| {name} | {cells} | {'-' if g2 is None else f'{g2:.2f}'} | "
              f"{'-' if g is None else f'{g:.3f}'} | "
              f"{'-' if ceiling is None else f'{ceiling:.1f}x'} |")
        result["sets"][name] = {"rates": {str(t): rates[name, t] for t in args.threads},
                                "median": {str(t): med[t] for t in args.threads},
                                "cpu_us": {str(t): cpu[t] for t in args.threads},
                                "g_two_threads": g2, **({"gil": gil[name]} if gil else {})}
    for name, info in gil.items():
        print(f"\n{name}: GIL held {info['held']} of {info['samples']} slice samples; "
              "heaviest GIL-held leaves (share of slice wall time):")
        for leaf, share in info["top"]:
            print(f"  {share:6.3f}  {leaf}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
