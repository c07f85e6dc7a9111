"""Benchmark the Dataset: open time, shuffled vs sequential read throughput, index memory.

Builds two synthetic datasets in a temporary folder (kept in the page cache by the OS):

- ``big``: ``--records`` records of about ``--record-bytes`` bytes (default 100k x 80 KB),
  read in order and in a shuffled order, in batches of ``--batch``, plus a plain sequential
  read of the same files for reference;
- ``tiny``: ``--tiny`` records of a few bytes (default 1M), opened from the manifest and as
  a list of bare TFRecord files, to time opening and measure index bytes per record, and
  ``Loader.records_at`` of a step of epoch 3 (8 ranks, batch 256) from a fresh loader.

Prints a table and ``csv,`` lines (``csv,name,value,unit``). Run smaller with e.g.
``python bench/bench_dataset.py --records 5000 --tiny 100000``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from shardfeed.dataset import Dataset
from shardfeed.format.example import encode_example
from shardfeed.format.manifest import Manifest
from shardfeed.format.writer import ShardWriter


def build(folder: Path, *, records: int, shards: int, payload: Callable[[int], bytes]) -> float:
    """Write ``records`` records into ``shards`` shards plus a manifest; return seconds."""
    folder.mkdir(parents=True)
    t0 = time.perf_counter()
    bounds = np.linspace(0, records, shards + 1).astype(int)
    infos = []
    for s in range(shards):
        with ShardWriter(folder / f"part-{s:05d}.tfrecord") as writer:
            for i in range(int(bounds[s]), int(bounds[s + 1])):
                writer.write(payload(i))
        infos.append(writer.close())
    Manifest(shards=infos, mode="embedded").save(folder / "shardfeed.json")
    return time.perf_counter() - t0


def raw_sequential(files: list[str]) -> tuple[int, float]:
    """Read every file start to end in 8 MiB blocks: (bytes, seconds)."""
    total = 0
    t0 = time.perf_counter()
    for name in files:
        with open(name, "rb", buffering=0) as fh:
            while True:
                block = fh.read(8 << 20)
                if not block:
                    break
                total += len(block)
    return total, time.perf_counter() - t0


def raw_record_reads(ds: Dataset, order: np.ndarray, batch: int) -> tuple[int, float]:
    """pread of each record's framed bytes in ``order``, in batches sorted by place like
    read_many, with no CRC and no parse: the cost of the access pattern alone."""
    fds = {url: os.open(url, os.O_RDONLY) for url in ds.shard_urls}
    places = [ds.locate(int(i)) for i in range(len(ds))]  # (path, record, offset)
    ends: dict[str, np.ndarray] = {}
    for url in ds.shard_urls:
        ends[url] = np.array([p[2] for p in places if p[0] == url] + [os.path.getsize(url)])
    total = 0
    t0 = time.perf_counter()
    for start in range(0, len(order), batch):
        for i in sorted(int(i) for i in order[start:start + batch]):
            path, rec, offset = places[i]
            length = int(ends[path][rec + 1]) - offset
            total += len(os.pread(fds[path], length, offset))
    secs = time.perf_counter() - t0
    for fd in fds.values():
        os.close(fd)
    return total, secs


def read_all(ds: Dataset, order: np.ndarray, batch: int) -> tuple[int, float]:
    """read_many over ``order`` in batches: (payload bytes decoded, seconds)."""
    total = 0
    t0 = time.perf_counter()
    for start in range(0, len(order), batch):
        for rec in ds.read_many(order[start:start + batch]):
            total += len(rec["image/encoded"])
    return total, time.perf_counter() - t0


def read_payloads(ds: Dataset, order: np.ndarray, batch: int) -> tuple[int, float]:
    """read_payloads over ``order`` in batches (read + CRC, no parse): (bytes, seconds)."""
    total = 0
    t0 = time.perf_counter()
    for start in range(0, len(order), batch):
        total += sum(len(p) for p in ds.read_payloads(order[start:start + batch]))
    return total, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--record-bytes", type=int, default=80_000)
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--tiny", type=int, default=1_000_000)
    parser.add_argument("--tiny-shards", type=int, default=16)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=2, help="best of N read passes")
    parser.add_argument("--tmp", type=Path, default=None, help="folder for the data")
    parser.add_argument("--keep", action="store_true", help="keep the data afterwards")
    args = parser.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="shardfeed-bench-", dir=args.tmp))
    rows: list[tuple[str, float, str]] = []

    def report(name: str, value: float, unit: str) -> None:
        rows.append((name, value, unit))
        print(f"csv,{name},{value:.6g},{unit}", flush=True)

    try:
        rng = np.random.default_rng(0)
        noise = rng.integers(0, 256, size=args.record_bytes + (1 << 20), dtype=np.uint8).tobytes()
        n = args.record_bytes

        def big_payload(i: int) -> bytes:
            start = (i * 7919) % (1 << 20)
            return encode_example({"image/encoded": noise[start:start + n], "label": i})

        def tiny_payload(i: int) -> bytes:
            return encode_example({"label": i})

        # --- tiny: opening and index memory -------------------------------------------------
        tiny_dir = tmp / "tiny"
        secs = build(tiny_dir, records=args.tiny, shards=args.tiny_shards, payload=tiny_payload)
        report("tiny_build_s", secs, "s")
        files = sorted(str(p) for p in tiny_dir.glob("*.tfrecord"))
        t0 = time.perf_counter()
        ds = Dataset(tiny_dir)
        t_open = time.perf_counter() - t0
        t0 = time.perf_counter()
        for k in range(ds.num_shards):  # touch every shard's index
            ds.locate(int(ds._table.starts[k]))
        t_touch = time.perf_counter() - t0
        report("tiny_records", len(ds), "records")
        report("open_manifest_s", t_open, "s")
        report("open_manifest_plus_index_load_s", t_open + t_touch, "s")
        report("index_bytes_per_record", ds.index_bytes() / len(ds), "B")
        # which records a late step held, from a fresh loader: one batch's work
        from shardfeed.pipeline import Loader

        t0 = time.perf_counter()
        loader = Loader(ds, batch_size=256, shuffle=True, seed=0, transform=None, rank=0,
                        world_size=8, num_threads=1)
        step = 3 * len(loader) + len(loader) // 2
        found = loader.records_at(step)
        report("records_at_fresh_loader_s", time.perf_counter() - t0, "s")
        t0 = time.perf_counter()
        loader.records_at(step + 1)
        report("records_at_next_step_s", time.perf_counter() - t0, "s")
        assert len(found.samples) == 8 * 256
        loader.close()
        ds.close()
        t0 = time.perf_counter()
        ds = Dataset(files)
        report("open_file_list_s", time.perf_counter() - t0, "s")
        ds.close()
        for name in tiny_dir.glob("*.idx*"):
            name.unlink()
        t0 = time.perf_counter()
        ds = Dataset(files)
        report("open_file_list_building_indexes_s", time.perf_counter() - t0, "s")
        ds.close()
        shutil.rmtree(tiny_dir)

        # --- big: shuffled vs sequential -----------------------------------------------------
        big_dir = tmp / "big"
        secs = build(big_dir, records=args.records, shards=args.shards, payload=big_payload)
        report("big_build_s", secs, "s")
        files = sorted(str(p) for p in big_dir.glob("*.tfrecord"))
        size = sum(os.path.getsize(f) for f in files)
        report("big_dataset_bytes", size, "B")
        raw_sequential(files)  # warm the page cache
        best: dict[str, float] = {}
        with Dataset(big_dir) as ds:
            seq = np.arange(len(ds))
            shuffled = np.random.default_rng(1).permutation(len(ds))
            for _ in range(args.repeat):
                nbytes, secs = raw_sequential(files)
                best["raw"] = max(best.get("raw", 0.0), nbytes / secs / 1e6)
                nbytes, secs = read_all(ds, seq, args.batch)
                best["seq"] = max(best.get("seq", 0.0), nbytes / secs / 1e6)
                nbytes, secs = read_all(ds, shuffled, args.batch)
                best["shuf"] = max(best.get("shuf", 0.0), nbytes / secs / 1e6)
                nbytes, secs = raw_record_reads(ds, shuffled, args.batch)
                best["shuf_raw"] = max(best.get("shuf_raw", 0.0), nbytes / secs / 1e6)
                nbytes, secs = read_payloads(ds, seq, args.batch)
                best["seq_pay"] = max(best.get("seq_pay", 0.0), nbytes / secs / 1e6)
                nbytes, secs = read_payloads(ds, shuffled, args.batch)
                best["shuf_pay"] = max(best.get("shuf_pay", 0.0), nbytes / secs / 1e6)
        report("raw_sequential_file_read_MBps", best["raw"], "MB/s")
        report("sequential_read_many_MBps", best["seq"], "MB/s")
        report("shuffled_read_many_MBps", best["shuf"], "MB/s")
        report("sequential_read_payloads_MBps", best["seq_pay"], "MB/s")
        report("shuffled_read_payloads_MBps", best["shuf_pay"], "MB/s")
        report("shuffled_over_sequential", best["shuf"] / best["seq"], "x")
        report("shuffled_payloads_over_sequential_payloads", best["shuf_pay"] / best["seq_pay"],
               "x")
        report("shuffled_over_raw_file_read", best["shuf"] / best["raw"], "x")
        report("shuffled_raw_record_reads_MBps", best["shuf_raw"], "MB/s")
        report("shuffled_raw_record_reads_over_raw_file_read", best["shuf_raw"] / best["raw"],
               "x")
        report("shuffled_records_per_s", best["shuf"] * 1e6 / args.record_bytes, "records/s")
    finally:
        if args.keep:
            print(f"data kept in {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    width = max(len(r[0]) for r in rows)
    print()
    print(f"{'measure'.ljust(width)}  {'value':>14}  unit")
    for name, value, unit in rows:
        print(f"{name.ljust(width)}  {value:>14,.4g}  {unit}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
