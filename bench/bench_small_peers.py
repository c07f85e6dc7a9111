"""Small images: shardfeed against its limit and tf.data, three sets in one run.

Three deterministic sets, built once under ``--data`` from bench_small.py's generators (the
same digits and photo crops, in the same order) and packed with
:func:`shardfeed.tools.pack.pack`, 2,500 records a shard:

- ``png28``: 70,000 (``--png-count``) 28x28 grey PNG digits in 10 class folders, so the
  records are sorted by label;
- ``raw28``: the same digits packed with ``mode="raw"`` (uint8 28x28x1 pixels, no codec);
- ``jpeg128``: 5,000 (``--jpeg-count``) 128x96 quality-90 JPEGs cut from scikit-image's
  photographs.

Contenders, batch 256, T = ``--threads``:

- ``decode`` (png28, jpeg128; the limit): the same encoded bytes, already in memory, decoded on
  T threads: ``cv2.imdecode(buf, cv2.IMREAD_GRAYSCALE)`` for png28,
  :func:`shardfeed.transforms.decode_image` (simplejpeg) for jpeg128; no reading, parsing or
  batching;
- ``gather`` (raw28; the limit): plain NumPy on one thread. Each shard file is memory-mapped
  and every record's pixel bytes are located once by parsing its TFRecord framing and Example
  (setup, untimed; checked against what shardfeed reads). Timed: one epoch of shuffled
  batches, each record's 784 bytes copied from the mapped shard into a preallocated
  (256, 28, 28, 1) uint8 array;
- ``shardfeed``: ``Loader(ds, batch_size=256, shuffle=True, seed=0, num_threads=t)`` with
  ``DecodeImage(channels="gray")`` (png28, raw28) or ``presets.train(size=64)`` (jpeg128), at
  t = 1 and t = T (T threads must never be slower than one); one epoch after 4 warm-up
  batches;
- ``tf.data``: ``TFRecordDataset`` over shardfeed's own shards, run by
  bench/peers/tfdata_loader.py in the bench-only TensorFlow environment: ``--kind png``
  (parse_single_example + decode_png(channels=1)), ``--kind raw`` (decode_raw + reshape) and
  ``--kind train`` at 64 px (sample_distorted_bounding_box + decode_and_crop_jpeg + resize +
  flip, shuffle(10000)); AUTOTUNE, batch 256, T threads. For png28 and raw28 it has no
  shuffle buffer (records in file order, several shards read at once: the cheapest order for
  it, as a buffer adds memory and time and changes none of its per-record work), while
  shardfeed hands out an exact shuffle. It first reads every record and checks the count and
  label sum.

Every measurement runs in a fresh subprocess (its own peak RSS, VmHWM); rounds are interleaved
(round 1 runs every contender of every set once, then round 2, ...). Each set gets a markdown
table: median images/s, the median per-round ratio to the set's limit and to tf.data (load
from other processes drifts between rounds and cancels in per-round ratios), CPU µs per image
(every thread of the contender's process over the timed epoch: the figure load distorts
least) and peak RSS. ``--other-src PATH`` also runs the shardfeed contenders with the package
from another source tree (the folder that holds ``shardfeed/``): before / after in one run.

    python bench/bench_small_peers.py [--data /tmp/sfsmallpeers] [--repeats 3] [--threads 2]
        [--sets png28 raw28 jpeg128] [--png-count 70000] [--jpeg-count 5000]
        [--other-src /tmp/before/src] [--tf-python /tmp/tfenv/bin/python] [--csv out.csv]

Create the TensorFlow environment with bench/peers/make_tfenv.sh if it is missing.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
SRC = BENCH.parent / "src"
BATCH = 256
WARMUP_BATCHES = 4
RECORDS_PER_SHARD = 2_500
TRAIN_SIZE = 64
SETS = ("png28", "raw28", "jpeg128")
LIMIT = {"png28": "decode", "raw28": "gather", "jpeg128": "decode"}
TF_KIND = {"png28": ("png", 28), "raw28": ("raw", 28), "jpeg128": ("train", TRAIN_SIZE)}
CONTENDERS = ("limit", "shardfeed", "tf.data")


# -- data (built in a subprocess, so that the driver never holds it) ------------------------------


def _image_folder(data: Path, name: str, count: int) -> Path:
    """``count`` images in 10 class folders, the same as bench_small.build makes (built once)."""
    import bench_small
    import cv2
    import numpy as np
    import simplejpeg

    images = data / f"{name}-{count}-images"
    if images.exists():
        return images
    tmp = data / f"{name}-{count}-images.tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    rng = np.random.Generator(np.random.Philox(5))  # bench_small.build's seed
    crops = bench_small._photo_crops(count) if name == "jpeg128" else []
    for i in range(count):
        label = i % 10
        folder = tmp / f"class{label}"
        folder.mkdir(exist_ok=True)
        if name == "png28":
            ok, buf = cv2.imencode(".png", bench_small._digit(rng, label))
            assert ok
            (folder / f"{i:06d}.png").write_bytes(buf.tobytes())
        else:
            (folder / f"{i:06d}.jpg").write_bytes(
                simplejpeg.encode_jpeg(crops[i], quality=90, colorsubsampling="420"))
    tmp.rename(images)
    return images


def prepare(data: Path, sets: list[str], png_count: int, jpeg_count: int) -> dict[str, Any]:
    """Build what ``sets`` need and return, per set, its dataset, record count and label sum."""
    sys.path.insert(0, str(SRC))
    sys.path.insert(0, str(BENCH))
    from shardfeed import Dataset
    from shardfeed.tools.pack import pack

    facts: dict[str, Any] = {}
    for name in sets:
        source, count = ("jpeg128", jpeg_count) if name == "jpeg128" else ("png28", png_count)
        packed = data / f"{name}-{count}"
        if not (packed / "shardfeed.json").exists():
            pack(str(_image_folder(data, source, count)), str(packed),
                 mode="raw" if name == "raw28" else "embedded",
                 records_per_shard=RECORDS_PER_SHARD, workers=2, overwrite=True)
        labels = 0
        with Dataset(str(packed)) as ds:
            records = len(ds)
            for start in range(0, records, 1024):
                for r in ds.read_many(range(start, min(records, start + 1024))):
                    labels += int(r["image/class/label"][0])
        facts[name] = {"dataset": str(packed), "records": records, "label_sum": labels}
    return facts


# -- one measurement (runs in its own subprocess) -------------------------------------------------


def _stored(dataset: str, key: str) -> list[bytes]:
    from shardfeed import Dataset

    values: list[bytes] = []
    with Dataset(dataset) as ds:
        for start in range(0, len(ds), 1024):
            chunk: list[Any] = ds.read_many(range(start, min(len(ds), start + 1024)))
            values.extend(bytes(r[key]) for r in chunk)
    return values


def _decode(job: dict[str, Any]) -> tuple[int, float, float]:
    import cv2
    import numpy as np

    from shardfeed.transforms import decode_image

    images = _stored(job["dataset"], "image/encoded")
    threads = job["threads"]
    chunks = [images[i::threads] for i in range(threads)]

    def grey(chunk: list[bytes]) -> None:
        for data in chunk:
            cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_GRAYSCALE)

    def colour(chunk: list[bytes]) -> None:
        for data in chunk:
            decode_image(data)

    run = grey if job["set"] == "png28" else colour
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(run, [c[:64] for c in chunks]))  # warm-up
        wall, cpu = time.perf_counter(), time.process_time()
        list(pool.map(run, chunks))
        return len(images), time.perf_counter() - wall, time.process_time() - cpu


def _varint(buf: Any, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(buf: Any, pos: int, end: int) -> Iterator[tuple[int, int, int]]:
    """(field number, start, end) of each length-delimited protobuf field in buf[pos:end]."""
    while pos < end:
        tag, pos = _varint(buf, pos)
        wire = tag & 7
        if wire == 2:
            size, pos = _varint(buf, pos)
            yield tag >> 3, pos, pos + size
            pos += size
        elif wire == 0:
            pos = _varint(buf, pos)[1]
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise ValueError(f"unexpected protobuf wire type {wire} at byte {pos}")


def _bytes_feature(buf: Any, start: int, end: int, key: bytes) -> tuple[int, int]:
    """Where the first value of the bytes feature ``key`` lies in the Example buf[start:end]
    (Example.features = 1; Features.feature map entries = 1, with key = 1, value = 2;
    Feature.bytes_list = 1; BytesList.value = 1)."""
    for _, f_start, f_end in _fields(buf, start, end):
        for _, e_start, e_end in _fields(buf, f_start, f_end):
            entry = {number: (s, e) for number, s, e in _fields(buf, e_start, e_end)}
            k_start, k_end = entry[1]
            if bytes(buf[k_start:k_end]) == key:
                for number, l_start, l_end in _fields(buf, *entry[2]):
                    if number == 1:
                        for _, v_start, v_end in _fields(buf, l_start, l_end):
                            return v_start, v_end
    raise ValueError(f"no bytes feature {key!r} in the record at byte {start}")


def _gather(job: dict[str, Any]) -> tuple[int, float, float]:
    import mmap

    import numpy as np

    folder = Path(job["dataset"])
    manifest = json.loads((folder / "shardfeed.json").read_text())
    arrays, shard_of, offset_of = [], [], []
    size = 0
    for k, shard in enumerate(manifest["shards"]):
        with open(folder / shard["path"], "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        arrays.append(np.frombuffer(mapped, np.uint8))
        pos = 0
        while pos < len(mapped):  # TFRecord framing: length u64, its crc u32, data, crc u32
            length = struct.unpack_from("<Q", mapped, pos)[0]
            start, end = _bytes_feature(mapped, pos + 12, pos + 12 + length, b"image/raw")
            size = end - start
            shard_of.append(k)
            offset_of.append(start)
            pos += 12 + length + 4
    expected = _stored(str(folder), "image/raw")  # the same bytes shardfeed reads, every record
    if len(expected) != len(offset_of) or any(
        arrays[s][o:o + size].tobytes() != e for s, o, e in zip(shard_of, offset_of, expected)
    ):
        raise SystemExit("gather: the parsed pixel offsets disagree with shardfeed's records")
    n = len(offset_of)
    side = job["side"]
    out = np.empty((BATCH, side, side, 1), np.uint8)
    flat = out.reshape(BATCH, side * side)
    order = np.random.default_rng(0).permutation(n).tolist()

    def batches(indices: list[int]) -> None:
        for first in range(0, len(indices), BATCH):
            for j, r in enumerate(indices[first:first + BATCH]):
                o = offset_of[r]
                flat[j] = arrays[shard_of[r]][o:o + size]

    batches(order[: WARMUP_BATCHES * BATCH])
    wall, cpu = time.perf_counter(), time.process_time()
    batches(order)
    return n, time.perf_counter() - wall, time.process_time() - cpu


def _loader(job: dict[str, Any]) -> tuple[int, float, float]:
    from shardfeed import Dataset
    from shardfeed.pipeline import Loader
    from shardfeed.transforms import DecodeImage, presets

    jpeg = job["set"] == "jpeg128"
    transform = presets.train(size=TRAIN_SIZE) if jpeg else DecodeImage(channels="gray")
    shape = (TRAIN_SIZE, TRAIN_SIZE, 3) if jpeg else (job["side"], job["side"], 1)
    ds = Dataset(job["dataset"])
    loader = Loader(ds, batch_size=BATCH, shuffle=True, seed=0, transform=transform,
                    num_threads=job["threads"], prefetch_batches=2, drop_last=False)
    try:
        for k, batch in enumerate(loader):  # warm-up: a few batches of epoch 0
            if tuple(batch["image"].shape[1:]) != shape:
                raise SystemExit(f"shardfeed: batch images {batch['image'].shape}, not {shape}")
            if k + 1 >= WARMUP_BATCHES:
                break
        loader.set_epoch(1)
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in loader:
            pass
        return len(ds), time.perf_counter() - wall, time.process_time() - cpu
    finally:
        loader.close()
        ds.close()


def _peak_rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return math.nan


def child(job: dict[str, Any]) -> None:
    """Run one measurement and print it as one JSON line."""
    sys.path.insert(0, job["src"])
    import shardfeed

    run = {"decode": _decode, "gather": _gather}.get(job["contender"], _loader)
    images, seconds, cpu = run(job)
    print(json.dumps({"images": images, "rate": images / seconds,
                      "cpu_us": 1e6 * cpu / images, "rss_mib": _peak_rss_mib(),
                      "module": shardfeed.__file__}), flush=True)
    os._exit(0)  # skip interpreter teardown (loader threads, mapped shards)


# -- driver ---------------------------------------------------------------------------------------


def _run(command: list[str], what: str) -> dict[str, Any] | None:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", OMP_NUM_THREADS="1")
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        sys.stderr.write(f"{what} failed (exit {done.returncode}):\n{done.stderr[-3000:]}\n")
        return None
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _jobs(set_name: str, facts: dict[str, Any], args: argparse.Namespace,
          versions: dict[str, str]) -> list[tuple[str, list[str]]]:
    """(row label, command) of every contender of one set, in running order."""
    side = TF_KIND[set_name][1]
    base = {"set": set_name, "dataset": facts["dataset"], "side": side, "src": str(SRC)}
    jobs: list[tuple[str, list[str]]] = []

    def ours(label: str, job: dict[str, Any]) -> None:
        jobs.append((label, [sys.executable, __file__, "--child", json.dumps(job)]))

    if "limit" in args.contenders:
        limit = LIMIT[set_name]
        threads = 1 if limit == "gather" else args.threads  # a gather loop holds the GIL
        plural = "thread" if threads == 1 else "threads"
        ours(f"{limit} (limit, {threads} {plural})", dict(base, contender=limit, threads=threads))
    if "shardfeed" in args.contenders:
        for threads in sorted({1, args.threads}):
            for version, src in versions.items():
                tag = "" if version == "this" else f" [{version}]"
                plural = "thread" if threads == 1 else "threads"
                ours(f"shardfeed {threads} {plural}{tag}",
                     dict(base, contender="shardfeed", threads=threads, src=src))
    if "tf.data" in args.contenders:
        kind, size = TF_KIND[set_name]
        jobs.append(("tf.data", [
            args.tf_python, str(BENCH / "peers" / "tfdata_loader.py"),
            "--shards", facts["dataset"], "--kind", kind, "--size", str(size),
            "--batch", str(BATCH), "--threads", str(args.threads),
            "--records", str(facts["records"]), "--label-sum", str(facts["label_sum"])]))
    return jobs


def _per_round_ratio(runs: dict[str, list[dict[str, Any]]], name: str, base: str) -> float:
    by_round = {r["round"]: r["rate"] for r in runs.get(base, [])}
    values = [r["rate"] / by_round[r["round"]] for r in runs.get(name, [])
              if r["round"] in by_round]
    return statistics.median(values) if values else math.nan


def _table(set_name: str, facts: dict[str, Any], runs: dict[str, list[dict[str, Any]]],
           args: argparse.Namespace) -> list[dict[str, Any]]:
    limit = next((name for name in runs if name.startswith(LIMIT[set_name])), "")
    rows = []
    for name, results in runs.items():
        rows.append({
            "set": set_name, "contender": name,
            "images_per_s": statistics.median(r["rate"] for r in results),
            "vs_limit": _per_round_ratio(runs, name, limit),
            "vs_tfdata": _per_round_ratio(runs, name, "tf.data"),
            "cpu_us_per_image": statistics.median(r["cpu_us"] for r in results),
            "peak_rss_mib": max(r["rss_mib"] for r in results),
            "rounds": " ".join(f"{r['rate']:.0f}" for r in results),
        })
    print(f"\n### {set_name}: {facts['records']:,} records, batch {BATCH}, "
          f"{args.threads} thread{'s' if args.threads != 1 else ''}, median of {args.repeats} interleaved rounds\n")
    print(f"| contender | images/s (median) | / {LIMIT[set_name]} | / tf.data | CPU µs/image "
          f"| peak RSS MiB | images/s per round |")
    print("|---|---:|---:|---:|---:|---:|---|")
    def ratio(value: float) -> str:
        if math.isnan(value):
            return "–"
        return f"{value:.2f}" if value >= 0.1 else f"{value:.3f}"

    for r in rows:
        print(f"| {r['contender']} | {r['images_per_s']:,.0f} | {ratio(r['vs_limit'])} | "
              f"{ratio(r['vs_tfdata'])} | {r['cpu_us_per_image']:.1f} | "
              f"{r['peak_rss_mib']:.0f} | {r['rounds']} |")
    tf_runs = runs.get("tf.data", [])
    if tf_runs:
        ok = all(r["reads_ok"] for r in tf_runs)
        print(f"\ntf.data read every record of shardfeed's shards: {'yes' if ok else 'NO'} "
              f"({tf_runs[0]['records_read']:,} of {facts['records']:,} records, label sum "
              f"{'agrees' if ok else 'DIFFERS'})")
    for name in runs:
        if name.startswith(f"shardfeed {args.threads} threads"):
            one = name.replace(f"{args.threads} threads", "1 thread")
            print(f"{name} / {one}: {_per_round_ratio(runs, name, one):.2f}")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--data", default="/tmp/sfsmallpeers")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS)
    parser.add_argument("--png-count", type=int, default=70_000,
                        help="records of png28 and raw28 (default 70000)")
    parser.add_argument("--jpeg-count", type=int, default=5_000,
                        help="records of jpeg128 (default 5000)")
    parser.add_argument("--other-src", default=None,
                        help="also run shardfeed from this source tree (the folder holding "
                             "shardfeed/)")
    parser.add_argument("--tf-python", default="/tmp/tfenv/bin/python",
                        help="Python of the environment with tensorflow-cpu")
    parser.add_argument("--csv", default=None, help="also write the CSV to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return 0
    if args.prepare:
        print(json.dumps(prepare(Path(args.data), args.sets, args.png_count, args.jpeg_count)))
        return 0
    if "tf.data" in args.contenders and not os.access(args.tf_python, os.X_OK):
        sys.stderr.write(f"{args.tf_python} not found: create the TensorFlow environment with "
                         f"bench/peers/make_tfenv.sh, pass --tf-python, or leave tf.data out "
                         f"with --contenders limit shardfeed\n")
        return 2

    started = time.perf_counter()
    facts = _run([sys.executable, __file__, "--prepare", "--data", args.data, "--sets",
                  *args.sets, "--png-count", str(args.png_count), "--jpeg-count",
                  str(args.jpeg_count)], "building the data")
    if facts is None:
        return 1
    sys.stderr.write(f"data ready under {args.data} ({time.perf_counter() - started:.0f} s)\n")
    versions = {"this": str(SRC)}
    if args.other_src:
        versions["other"] = str(Path(args.other_src).resolve())
    plan = {name: _jobs(name, facts[name], args, versions) for name in args.sets}

    runs: dict[str, dict[str, list[dict[str, Any]]]] = {name: {} for name in args.sets}
    for round_ in range(args.repeats):
        for set_name, jobs in plan.items():
            for label, command in jobs:
                result = _run(command, f"{set_name} {label}")
                if result is None:
                    continue
                if label == "tf.data":
                    result["cpu_us"] = 1000 * result["cpu_ms_per_image"]
                result["round"] = round_
                runs[set_name].setdefault(label, []).append(result)
                sys.stderr.write(f"round {round_ + 1} {set_name:8s} {label:28s} "
                                 f"{result['rate']:9.0f}/s  cpu {result['cpu_us']:7.1f} µs  "
                                 f"rss {result['rss_mib']:5.0f} MiB\n")

    print(f"{os.cpu_count()} CPUs; shardfeed from {SRC}"
          + (f", [other] from {versions['other']}" if args.other_src else ""))
    rows = [row for name in args.sets for row in _table(name, facts[name], runs[name], args)]
    fields = ["set", "contender", "images_per_s", "vs_limit", "vs_tfdata", "cpu_us_per_image",
              "peak_rss_mib", "rounds"]
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(fields)
    for row in rows:
        writer.writerow(f"{row[f]:.4g}" if isinstance(row[f], float) else row[f] for f in fields)
    print()
    print(text.getvalue(), end="")
    if args.csv:
        Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
        Path(args.csv).write_text(text.getvalue())
    tf_ok = all(r["reads_ok"] for s in runs.values() for r in s.get("tf.data", []))
    return 0 if tf_ok else 1


if __name__ == "__main__":
    sys.exit(main())
