"""Per-sample overhead of the Loader on small images, against the decode limit.

On small images the decoder is fast and what the loader does around it (reading and parsing
the record, keyed randomness, the transform chain, writing the batch row) decides the rate.
This script measures it on two deterministic sets, built once under ``--data``:

- ``png28``: 20,000 28x28 grayscale PNGs in 10 class folders (handwriting-like digits drawn
  with OpenCV: stroke width, slant, position and noise vary), the "per-record overhead" set;
- ``jpeg128``: 5,000 128x96 quality-90 JPEGs cut from scikit-image's photographs.

Both are packed with :func:`shardfeed.tools.pack.pack`. For each set, contenders:

- ``decode``: :func:`shardfeed.transforms.decode_image` of the same encoded bytes, already in
  memory, on T threads (the decode limit; no reading, parsing or batching);
- ``none``: ``Loader(transform=None)`` (read + parse + batch the stored features);
- ``train``: ``presets.train(size)`` (random resized crop + flip);
- ``eval``: ``presets.eval(size)`` (center crop), unshuffled.

Batch 256, T = ``--threads`` threads, prefetch 2; each timed run is one whole epoch after a
short warm-up. Rounds are interleaved (round 1 runs every contender once, then round 2, ...)
and the table gives medians: samples/s, wall µs per sample, CPU µs per sample (all threads
of the measuring process; load from other processes distorts it far less than wall time) and
the ratio of the median rate to the median decode limit.

``--other-src PATH`` also runs every loader contender with the package imported from another
source tree (the folder that holds ``shardfeed/``), in the same interleaved rounds: before /
after figures from one run. Each source tree runs in its own long-lived worker process.

    python bench/bench_small.py [--data /tmp/sfsmall] [--repeats 3] [--threads 2]
                                [--other-src /tmp/before/src] [--csv out.csv]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

BATCH = 256
WARMUP_BATCHES = 4
SETS: dict[str, dict[str, Any]] = {
    "png28": {"count": 20_000, "size": 28},
    "jpeg128": {"count": 5_000, "size": 64},
}
CONTENDERS = ("decode", "none", "train", "eval")


# -- data -----------------------------------------------------------------------------------------


def _digit(rng: np.random.Generator, label: int) -> np.ndarray:
    import cv2

    canvas = np.zeros((56, 56), np.uint8)
    scale = float(rng.uniform(1.2, 1.8))
    thickness = int(rng.integers(2, 6))
    x = int(rng.integers(6, 18))
    y = int(rng.integers(38, 50))
    cv2.putText(canvas, str(label), (x, y), cv2.FONT_HERSHEY_SIMPLEX, scale, 255, thickness,
                cv2.LINE_AA)
    shear = float(rng.uniform(-0.3, 0.3))
    matrix = np.array([[1.0, shear, -shear * 28], [0.0, 1.0, 0.0]])
    canvas = cv2.warpAffine(canvas, matrix, (56, 56))
    small = cv2.resize(canvas, (28, 28), interpolation=cv2.INTER_AREA).astype(np.int16)
    small += rng.integers(-8, 9, small.shape, dtype=np.int16)
    out: np.ndarray = np.clip(small, 0, 255).astype(np.uint8)
    return out


def _photo_crops(count: int) -> list[np.ndarray]:
    import cv2
    from skimage import data

    photos = [data.astronaut(), data.chelsea(), data.coffee(), data.rocket()]
    rng = np.random.Generator(np.random.Philox(11))
    crops = []
    for i in range(count):
        photo = photos[i % len(photos)]
        h, w = photo.shape[:2]
        ch = int(rng.integers(96, min(h, 384)))
        cw = min(w, ch * 4 // 3)
        y = int(rng.integers(0, h - ch + 1))
        x = int(rng.integers(0, w - cw + 1))
        crop = cv2.resize(photo[y : y + ch, x : x + cw], (128, 96), interpolation=cv2.INTER_AREA)
        crops.append(crop)
    return crops


def build(data: Path) -> dict[str, Path]:
    """Build (once) both image folders and their packed datasets; returns the datasets."""
    import cv2
    import simplejpeg

    from shardfeed.tools.pack import pack

    out: dict[str, Path] = {}
    for name, cfg in SETS.items():
        images = data / f"{name}-images"
        packed = data / name
        out[name] = packed
        if (packed / "shardfeed.json").exists():
            continue
        count = int(cfg["count"])
        if not images.exists():
            tmp = data / f"{name}-images.tmp"
            tmp.mkdir(parents=True, exist_ok=True)
            rng = np.random.Generator(np.random.Philox(5))
            crops = _photo_crops(count) if name == "jpeg128" else []
            for i in range(count):
                label = i % 10
                folder = tmp / f"class{label}"
                folder.mkdir(exist_ok=True)
                if name == "png28":
                    ok, buf = cv2.imencode(".png", _digit(rng, label))
                    assert ok
                    (folder / f"{i:06d}.png").write_bytes(buf.tobytes())
                else:
                    (folder / f"{i:06d}.jpg").write_bytes(
                        simplejpeg.encode_jpeg(crops[i], quality=90, colorsubsampling="420")
                    )
            tmp.rename(images)
        pack(str(images), str(packed), records_per_shard=2_500, workers=2, overwrite=True)
    return out


def encoded_images(dataset: Path) -> list[bytes]:
    from shardfeed import Dataset

    with Dataset(str(dataset)) as ds:
        return [bytes(r["image/encoded"]) for r in ds]


# -- one measurement (runs inside a worker process) -----------------------------------------------


def _cpu() -> float:
    return time.process_time()


def measure_decode(images: list[bytes], threads: int) -> tuple[float, float]:
    from shardfeed.transforms import decode_image

    chunks = [images[i::threads] for i in range(threads)]

    def run(chunk: list[bytes]) -> None:
        for data in chunk:
            decode_image(data)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(run, [c[:64] for c in chunks]))  # warm-up
        wall, cpu = time.perf_counter(), _cpu()
        list(pool.map(run, chunks))
        return time.perf_counter() - wall, _cpu() - cpu


def measure_loader(dataset: Path, contender: str, size: int, threads: int) -> tuple[float, float]:
    from shardfeed import Dataset
    from shardfeed.pipeline import Loader
    from shardfeed.transforms import presets

    transform = {"none": None, "train": presets.train(size=size),
                 "eval": presets.eval(size=size)}[contender]
    ds = Dataset(str(dataset))
    loader = Loader(ds, batch_size=BATCH, shuffle=contender != "eval", seed=0,
                    transform=transform, num_threads=threads, prefetch_batches=2,
                    drop_last=False)
    try:
        for k, _ in enumerate(loader):  # warm-up: a few batches of epoch 0
            if k + 1 >= WARMUP_BATCHES:
                break
        loader.set_epoch(1)
        wall, cpu = time.perf_counter(), _cpu()
        for _ in loader:
            pass
        return time.perf_counter() - wall, _cpu() - cpu
    finally:
        loader.close()
        ds.close()


def worker(src: str) -> None:
    """Answer jobs (JSON lines on stdin) with timings (JSON lines on stdout)."""
    sys.path.insert(0, src)
    import shardfeed

    images: dict[str, list[bytes]] = {}
    print(json.dumps({"ready": shardfeed.__file__}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        dataset = Path(job["dataset"])
        if job["contender"] == "decode":
            if job["set"] not in images:
                images[job["set"]] = encoded_images(dataset)
            wall, cpu = measure_decode(images[job["set"]], job["threads"])
        else:
            wall, cpu = measure_loader(dataset, job["contender"], job["size"], job["threads"])
        print(json.dumps({"wall": wall, "cpu": cpu}), flush=True)


class Worker:
    def __init__(self, src: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", src], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True,
        )
        ready = json.loads(self._line())
        self.module = ready["ready"]

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("a benchmark worker died; run it alone to see its traceback")
        return line

    def run(self, job: dict[str, Any]) -> dict[str, float]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        result: dict[str, float] = json.loads(self._line())
        return result

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


# -- driver ---------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="/tmp/sfsmall")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=list(SETS))
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS)
    parser.add_argument("--other-src", default=None)
    parser.add_argument("--csv", default=None, help="also write the CSV to this file")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker)
        return

    here = str(Path(__file__).resolve().parents[1] / "src")
    sys.path.insert(0, here)
    datasets = build(Path(args.data))
    versions = {"this": here}
    if args.other_src:
        versions["other"] = str(Path(args.other_src).resolve())
    workers = {name: Worker(src) for name, src in versions.items()}
    for name, w in workers.items():
        print(f"# {name}: {w.module}", file=sys.stderr)

    results: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    count = {name: int(SETS[name]["count"]) for name in args.sets}
    try:
        for round_ in range(args.repeats):
            for set_name in args.sets:
                for contender in args.contenders:
                    names = ["this"] if contender == "decode" else list(workers)
                    for version in names:
                        job = {"set": set_name, "dataset": str(datasets[set_name]),
                               "contender": contender, "size": SETS[set_name]["size"],
                               "threads": args.threads}
                        r = workers[version].run(job)
                        results.setdefault((set_name, contender, version), []).append(
                            (r["wall"], r["cpu"])
                        )
                        n = count[set_name]
                        print(f"# round {round_ + 1} {set_name:8s} {contender:7s} {version:6s} "
                              f"{n / r['wall']:9.0f}/s  cpu {1e6 * r['cpu'] / n:7.1f} µs",
                              file=sys.stderr, flush=True)
    finally:
        for w in workers.values():
            w.close()

    rows = []
    for (set_name, contender, version), runs in results.items():
        n = count[set_name]
        rate = statistics.median(n / wall for wall, _ in runs)
        decode = results.get((set_name, "decode", "this"))
        limit = statistics.median(n / wall for wall, _ in decode) if decode else float("nan")
        rows.append({
            "set": set_name, "contender": contender, "version": version,
            "samples_per_s": rate,
            "wall_us": statistics.median(1e6 * wall / n for wall, _ in runs),
            "cpu_us": statistics.median(1e6 * cpu / n for _, cpu in runs),
            "vs_decode": rate / limit,
            "rounds": len(runs),
        })
    header = f"{'set':8s} {'contender':9s} {'version':7s} {'samples/s':>10s} {'wall µs':>8s} " \
             f"{'cpu µs':>8s} {'/decode':>8s}"
    print(f"threads={args.threads} batch={BATCH} medians of {args.repeats} interleaved rounds")
    print(header)
    for row in rows:
        print(f"{row['set']:8s} {row['contender']:9s} {row['version']:7s} "
              f"{row['samples_per_s']:10.0f} {row['wall_us']:8.1f} {row['cpu_us']:8.1f} "
              f"{row['vs_decode']:8.2f}")
    fields = list(rows[0])
    lines = [",".join(fields)] + [
        ",".join(f"{row[f]:.4g}" if isinstance(row[f], float) else str(row[f]) for f in fields)
        for row in rows
    ]
    print()
    print("\n".join(lines))
    if args.csv:
        Path(args.csv).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
