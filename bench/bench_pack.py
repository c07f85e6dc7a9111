"""Pack throughput from Parquet (a data lake's export: an image-bytes column and a label
column): one machine's ``shardfeed.pack`` against ``pack_ray`` on a local Ray (2 CPUs), and
both against reading the inputs alone.

Two inputs, written once under a temporary folder:

* ``small``: ``--small`` 32x32 PNGs (about 3 KB each) in 4 Parquet files: the cost a record;
* ``large``: ``--large`` ImageNet-sized JPEGs (500x375, about 90 KB) in 4 files: the cost a
  byte.

Runs, interleaved over ``--rounds`` rounds, each into a new output folder:

* ``read only``: the Parquet files read row by row by pack's own reader (pyarrow batches to
  Python rows, every image's bytes touched): what a pack pays to see its input;
* ``pack``: ``shardfeed.pack(files, out, fields=...)``: headers checked, records written,
  indexes and manifest (its default: no read-back of the parts);
* ``pack workers=2``: the same with 2 threads building records;
* ``ray``: ``pack_ray(ray.data.read_parquet(files), out, fields=...)`` with ``ray.init
  (num_cpus=2)`` started once before timing: a partition a write task, the merge reading
  every part back against its CRC32C (its default, ``verify=True``).

Records/s and MB/s (image bytes in) are medians over rounds.

    .venv/bin/python bench/bench_pack.py [--small 20000] [--large 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np


def small_images(n: int) -> list[bytes]:
    import cv2

    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        pixels = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
        pixels[:, :16] = i % 256  # half flat: PNG-sized like a real small image
        out.append(bytes(cv2.imencode(".png", pixels)[1]))
    return out


def large_images(n: int) -> list[bytes]:
    from bench_remote_cache import photo_like

    rng = np.random.default_rng(1)
    yy, xx = np.mgrid[0:375, 0:500]
    return [photo_like(i, rng, yy, xx) for i in range(n)]


def write_parquet(folder: Path, images: list[bytes], files: int = 4) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True)
    bounds = np.linspace(0, len(images), files + 1).astype(int)
    paths = []
    for k in range(files):
        part = images[bounds[k]:bounds[k + 1]]
        table = pa.table({"image": part, "label": [i % 100 for i in range(bounds[k],
                                                                           bounds[k + 1])]})
        path = folder / f"part-{k}.parquet"
        pq.write_table(table, path, row_group_size=1024)
        paths.append(str(path))
    return paths


def read_only(paths: list[str]) -> int:
    """The rows pack reads (its own Parquet reader), every image's bytes touched."""
    from shardfeed import RowFields
    from shardfeed.tools.pack.rows import rows_of

    rows, _ = rows_of(paths, RowFields(image="image", labels=["label"]))
    return sum(len(row["image"]) > 0 for row in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=20_000)
    parser.add_argument("--large", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import ray

    import shardfeed
    from shardfeed import RowFields
    from shardfeed.tools.ray import pack_ray

    work = Path(tempfile.mkdtemp(prefix="shardfeed-bench-pack-"))
    try:
        inputs = {}
        for name, images in (("small", small_images(args.small)),
                             ("large", large_images(args.large))):
            inputs[name] = (write_parquet(work / name, images), len(images),
                            sum(len(b) for b in images))
        fields = RowFields(image="image", labels=["label"])
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        outputs = iter(range(1_000_000))

        def out() -> Path:
            return work / "out" / str(next(outputs))

        runs: dict[str, Callable[[list[str]], object]] = {
            "read only": read_only,
            "pack": lambda p: shardfeed.pack(p, out(), fields=fields, progress=False),
            "pack workers=2": lambda p: shardfeed.pack(p, out(), fields=fields,
                                                       progress=False, workers=2),
            "ray": lambda p: pack_ray(ray.data.read_parquet(p), out(), fields=fields),
        }
        for paths, _, _ in inputs.values():  # warm: page cache, pyarrow's first reads
            read_only(paths)
        times: dict[tuple[str, str], list[float]] = {}
        # Ray's runs last in a round: its processes stay busy a while after a write
        order = sorted(runs, key=lambda run: run == "ray")
        for r in range(args.rounds):
            for run in order:
                for name, (paths, _, _) in inputs.items():
                    began = time.perf_counter()
                    runs[run](paths)
                    times.setdefault((name, run), []).append(time.perf_counter() - began)
            shutil.rmtree(work / "out", ignore_errors=True)
            print(f"round {r + 1} done", flush=True)
        ray.shutdown()
        report(inputs, runs, times, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(inputs: dict[str, tuple[list[str], int, int]], runs: dict[str, object],
           times: dict[tuple[str, str], list[float]], args: argparse.Namespace) -> None:
    print(f"\nParquet input, 4 files each: small = {args.small:,} 32x32 PNGs, large = "
          f"{args.large:,} 500x375 JPEGs; Ray local with 2 CPUs; medians of {args.rounds} "
          "rounds\n")
    print("| input | run | records/s | MB/s | / read only |")
    print("|---|---|---:|---:|---:|")
    for name, (_, n, nbytes) in inputs.items():
        base = statistics.median(times[(name, "read only")])
        for run in runs:
            t = statistics.median(times[(name, run)])
            print(f"| {name} | {run} | {n / t:,.0f} | {nbytes / t / 1e6:,.1f} | "
                  f"{base / t:.2f} |")


if __name__ == "__main__":
    main()
