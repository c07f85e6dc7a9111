"""OpenCV's own thread pool beside the loader's threads: images/s and CPU µs an image, with
the pool off (what a Loader sets: ``cv2.setNumThreads(0)``) and on (OpenCV's default, a
worker a core, set back after the loader started).

OpenCV splits each resize over its pool, whose workers wait for the next job by spinning
(``sched_yield``); the loader's threads already run a slice each, so the pool adds no work
done, only CPU burnt beside them. Each measurement is a fresh process (the pool's threads
live for the process), the two settings interleaved, ``--rounds`` each; the table gives
medians. Workload: bench_tf_bridge's ImageNet-style JPEGs (213x160, 320x240, 427x320),
``presets.train(64)``, batch ``--batch``::

    .venv/bin/python bench/bench_opencv_pool.py [--threads 1 2] [--rounds 3] [--batch 16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

IMAGES = 3000


def child(folder: Path, threads: int, batch: int, pool: str, seconds: float) -> None:
    import cv2

    import shardfeed

    loader = shardfeed.Loader(shardfeed.Dataset(str(folder)), batch_size=batch, shuffle=True,
                              seed=0, transform=shardfeed.presets.train(64),
                              num_threads=threads, drop_last=True)

    def endless() -> object:
        while True:
            for made in loader:
                yield len(made["image"])

    batches = endless()
    next(batches)  # the loader's threads started: it set OpenCV's pool off
    if pool == "on":
        cv2.setNumThreads(os.cpu_count() or 1)
    start = time.perf_counter()
    while time.perf_counter() - start < 1.5:
        next(batches)
    images, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        images += next(batches)  # type: ignore[operator]
    wall, used = time.perf_counter() - start, time.process_time() - cpu
    print(json.dumps({"rate": images / wall, "cpu_us": used / images * 1e6,
                      "opencv_threads": cv2.getNumThreads()}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        folder, threads, pool, seconds = args.child
        child(Path(folder), int(threads), args.batch, pool, float(seconds))
        return 0
    import bench_tf_bridge

    print(f"{os.cpu_count()} CPUs; presets.train(64), batch {args.batch}; median of "
          f"{args.rounds} fresh processes a row")
    print(f"{'threads':>8}{'OpenCV pool':>13}{'images/s':>10}{'CPU us/img':>12}")
    with tempfile.TemporaryDirectory(prefix="shardfeed-cvpool-") as tmp:
        work = bench_tf_bridge._imagenet(Path(tmp), IMAGES, 2)
        for threads in args.threads:
            runs: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
            for _ in range(args.rounds):
                for pool, rows in runs.items():
                    out = subprocess.run(
                        [sys.executable, __file__, "--batch", str(args.batch), "--child",
                         str(work.folder), str(threads), pool, str(args.seconds)],
                        capture_output=True, text=True, check=True).stdout
                    rows.append(json.loads(out.strip().splitlines()[-1]))
            for pool, rows in runs.items():
                rate = statistics.median(r["rate"] for r in rows)
                cpu = statistics.median(r["cpu_us"] for r in rows)
                print(f"{threads:>8}{pool:>13}{rate:>10,.0f}{cpu:>12,.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
