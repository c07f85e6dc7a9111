"""Read throughput of synthetic shards: local files vs a local S3-compatible server.

Writes ``--records`` records (default 2,000 of 60-100 KB, about 160 MB) into ``--shards``
shards, starts moto's S3 server in a separate process on 127.0.0.1, uploads the shards, then
reads every record once per configuration: ``--batch`` records a step in shuffled or file
order, one ``read_ranges`` call per shard of the step (as ``Dataset.read_many`` does), with
8/16/32 requests in flight per call and with range coalescing off or on. Prints a table (and
CSV with ``--csv``): records/s, MB/s of record bytes, requests sent and the over-fetch ratio
(bytes fetched / bytes asked).

    .venv/bin/python bench/bench_storage.py [--records 2000] [--shards 16] [--batch 512]

The local S3 server is a Python process on the same machine (moto reads the whole object for
every ranged GET, hence several shards rather than one large one), so its figures measure the
client's overheads and the server's limits, not a cloud store's latency.
"""

from __future__ import annotations

import argparse
import csv
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from shardfeed.storage import LocalSource
from shardfeed.storage.remote import RemoteSource


def write_shard(path: Path, records: int, rng: np.random.Generator) -> np.ndarray:
    """Write ``records`` random records back to back; return the n+1 offsets."""
    sizes = rng.integers(60_000, 100_001, size=records)
    offsets = np.zeros(records + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    block = rng.bytes(int(sizes.max()))
    with open(path, "wb") as handle:
        handle.writelines(block[:size] for size in sizes.tolist())
    return offsets


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def moto_server() -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError("moto server did not start")
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)


def run_epoch(
    readers: Sequence[Callable[[Sequence[tuple[int, int]]], list[bytes]]],
    locations: np.ndarray,
    offsets: list[np.ndarray],
    order: np.ndarray,
    batch: int,
) -> float:
    """Read every record in ``order``; ``locations[i]`` = (shard, record in shard)."""
    start = time.perf_counter()
    for lo in range(0, len(order), batch):
        step = locations[order[lo : lo + batch]]
        for shard in np.unique(step[:, 0]).tolist():
            recs = step[step[:, 0] == shard, 1]
            offs = offsets[shard]
            ranges = [(int(offs[r]), int(offs[r + 1] - offs[r])) for r in recs.tolist()]
            blobs = readers[shard](ranges)
            if any(len(b) != n for b, (_, n) in zip(blobs, ranges)):
                raise RuntimeError("short read")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--batch", type=int, default=512, help="records a step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--csv", type=Path, default=None)
    args = parser.parse_args()

    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        rng = np.random.default_rng(args.seed)
        counts = np.full(args.shards, args.records // args.shards)
        counts[: args.records % args.shards] += 1
        names = [f"shard-{k:05d}.tfrecord" for k in range(args.shards)]
        paths = [Path(tmp) / name for name in names]
        offsets = [write_shard(p, int(c), rng) for p, c in zip(paths, counts)]
        locations = np.array([(k, r) for k, c in enumerate(counts.tolist()) for r in range(c)])
        total_bytes = sum(int(o[-1]) for o in offsets)
        orders = {
            "shuffled": np.random.default_rng(args.seed + 1).permutation(args.records),
            "file": np.arange(args.records),
        }

        def record(storage: str, order: str, inflight: int | str, gap: str,
                   seconds: float, requests: int | str, fetched: int) -> None:
            rows.append({
                "storage": storage, "order": order, "in_flight": inflight, "coalesce": gap,
                "records_per_s": round(args.records / seconds, 1),
                "MB_per_s": round(total_bytes / seconds / 1e6, 1),
                "requests": requests,
                "overfetch": round(fetched / total_bytes, 3),
            })
            print(" ".join(f"{k}={v}" for k, v in rows[-1].items()), file=sys.stderr, flush=True)

        for order_name, order in orders.items():
            locals_ = [LocalSource(p) for p in paths]
            readers = [s.read_ranges for s in locals_]
            run_epoch(readers, locations, offsets, order, args.batch)  # warm the page cache
            seconds = run_epoch(readers, locations, offsets, order, args.batch)
            for local in locals_:
                local.close()
            record("local", order_name, "-", "-", seconds, "-", total_bytes)

        os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
        os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        with moto_server() as endpoint:
            import s3fs

            options = {"client_kwargs": {"endpoint_url": endpoint}}
            fs = s3fs.S3FileSystem(**options)
            fs.mkdir("bench")
            for path, name in zip(paths, names):
                fs.put_file(str(path), f"bench/{name}")
            urls = [f"s3://bench/{name}" for name in names]
            for order_name, order in orders.items():
                for inflight in (8, 16, 32):
                    for gap_name, gap in (("off", -1), ("256KiB", 256 * 1024)):
                        sources = [
                            RemoteSource(u, max_concurrency=inflight, coalesce_gap_bytes=gap,
                                         storage_options=options)
                            for u in urls
                        ]
                        seconds = run_epoch([s.read_ranges for s in sources], locations,
                                            offsets, order, args.batch)
                        requests = sum(s.stats()["requests"] for s in sources)
                        fetched = sum(s.stats()["bytes_fetched"] for s in sources)
                        for source in sources:
                            source.close()
                        record("s3 (moto)", order_name, inflight, gap_name, seconds,
                               requests, fetched)

    print_table(
        rows,
        f"# {args.records} records in {args.shards} shards, {total_bytes / 1e6:.1f} MB, "
        f"{args.batch} records a step, one read_ranges call per shard of a step",
        args.csv,
    )


def print_table(rows: list[dict[str, Any]], title: str, csv_path: str | None) -> None:
    """Print ``rows`` as an aligned table under ``title``; also write them as CSV if asked."""
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}
    print(title)
    print("  ".join(c.rjust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(str(row[c]).rjust(widths[c]) for c in columns))
    if csv_path is not None:
        with open(csv_path, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
