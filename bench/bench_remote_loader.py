"""End-to-end Loader throughput: shards on a local S3-compatible server vs the same local files.

Writes ``--records`` Examples (default 1,200 holding 60-100 KB of bytes each, about 100 MB)
into ``--shards`` shards with a manifest, starts moto's S3 server in a separate process on
127.0.0.1 and uploads the dataset, then reads one shuffled epoch per configuration through
``Dataset`` + ``Loader`` (``transform=None``, ``--threads`` threads, ``--batch`` a batch):
local files, then S3 with 8/16/32 requests in flight per read and coalescing on or off.
Prints records/s, MB/s of record bytes and the GETs sent (table; CSV with ``--csv``).

    .venv/bin/python bench/bench_remote_loader.py [--records 1200] [--shards 8] [--threads 4]

Coalescing ``on``: the Dataset's default read plan (records up to 64 KiB apart in one range,
ranges up to 1 MiB) and the remote source's merging (holes up to 256 KiB, requests up to
32 MiB). ``off``: every record its own range and its own GET. The remote options go in
through ``Dataset(url, source_options={"max_concurrency": ..., "coalesce_gap_bytes": ...})``;
``max_concurrency`` bounds both the GETs of one shard's ranges and the shards one
``read_many`` reads at once.

The server is a Python process on the same machine: the figures measure the client's
overheads and the server's limits, not a cloud store's latency. ``--latency-ms 20`` puts a
TCP relay in front of it that holds each request that long before passing it on (about
an object store's time to first byte), which is where requests in flight pay off.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_storage import moto_server, print_table

from shardfeed import Dataset, Loader
from shardfeed.dataset.reading import ReadOptions
from shardfeed.format.writer import ShardWriter
from shardfeed.storage.remote import set_storage_options
from shardfeed.tools.index import index_files

COALESCE = {
    "on": (ReadOptions(), 256 * 1024),
    "off": (ReadOptions(coalesce_gap_bytes=0, max_read_bytes=1), -1),
}


def write_dataset(folder: Path, records: int, shards: int, seed: int) -> int:
    """Write the shards and the manifest; return the bytes of record payload."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    block = rng.bytes(100_000)
    sizes = rng.integers(60_000, 100_001, size=records).tolist()
    bounds = np.linspace(0, records, shards + 1).astype(int)
    for k in range(shards):
        with ShardWriter(str(folder / f"shard-{k:05d}.tfrecord")) as writer:
            for i in range(bounds[k], bounds[k + 1]):
                writer.write_example({"image/encoded": block[: sizes[i]], "label": [i % 10]})
    index_files(str(folder))
    return int(sum(sizes))


@contextlib.contextmanager
def delaying_relay(endpoint: str, latency_s: float) -> Iterator[str]:
    """A TCP relay to ``endpoint`` that holds every chunk a client sends (a request, on a
    keep-alive connection) for ``latency_s`` before passing it on; yields its own URL."""
    host, port = endpoint.removeprefix("http://").split(":")
    listener = socket.create_server(("127.0.0.1", 0), backlog=256)
    pipes: list[threading.Thread] = []

    def pipe(src: socket.socket, dst: socket.socket, delay: float) -> None:
        try:
            while data := src.recv(1 << 16):
                if delay:
                    time.sleep(delay)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def accept() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection((host, int(port)))
            for args in ((client, upstream, latency_s), (upstream, client, 0.0)):
                thread = threading.Thread(target=pipe, args=args, daemon=True)
                thread.start()
                pipes.append(thread)

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()
        acceptor.join(timeout=10)


def one_epoch(ds: Dataset, *, batch: int, threads: int, seed: int) -> tuple[float, int]:
    with Loader(ds, batch_size=batch, shuffle=True, seed=seed, transform=None,
                num_threads=threads, rank=0, world_size=1) as loader:
        start = time.perf_counter()
        count = sum(len(b["label"]) for b in loader)
        return time.perf_counter() - start, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1200)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--latency-ms", type=float, default=0.0,
                        help="hold each request this long on the way to the server")
    parser.add_argument("--csv", type=Path, default=None)
    args = parser.parse_args()

    rows: list[dict[str, Any]] = []

    def record(storage: str, inflight: int | str, coalesce: str, seconds: float, count: int,
               requests: int | str) -> None:
        rows.append({
            "storage": storage, "in_flight": inflight, "coalesce": coalesce,
            "records_per_s": round(count / seconds, 1),
            "MB_per_s": round(payload_bytes * count / args.records / seconds / 1e6, 1),
            "GETs": requests,
        })
        print(" ".join(f"{k}={v}" for k, v in rows[-1].items()), file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "ds"
        payload_bytes = write_dataset(folder, args.records, args.shards, args.seed)
        for name, (read_options, _) in COALESCE.items():
            with Dataset(str(folder), read_options=read_options) as ds:
                one_epoch(ds, batch=args.batch, threads=args.threads, seed=args.seed)  # warm
                seconds, count = one_epoch(ds, batch=args.batch, threads=args.threads,
                                           seed=args.seed)
            record("local", "-", name, seconds, count, "-")

        os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
        os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        with moto_server() as endpoint, delaying_relay(endpoint, args.latency_ms / 1e3) as relay:
            import s3fs

            fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint})
            fs.mkdir("bench")
            fs.put(str(folder) + "/", "bench/ds/", recursive=True)
            set_storage_options("s3://", client_kwargs={"endpoint_url": relay})
            storage = f"s3 (moto, +{args.latency_ms:g} ms)"
            for inflight in (8, 16, 32):
                for name, (read_options, gap) in COALESCE.items():
                    # botocore keeps 10 connections by default: at most 10 requests in
                    # flight whatever max_concurrency says, unless its pool is larger
                    pool = {"config_kwargs": {"max_pool_connections": inflight + args.threads}}
                    source_options = {"max_concurrency": inflight, "coalesce_gap_bytes": gap,
                                      "storage_options": pool}
                    with Dataset("s3://bench/ds", read_options=read_options,
                                 source_options=source_options) as ds:
                        seconds, count = one_epoch(ds, batch=args.batch,
                                                   threads=args.threads, seed=args.seed)
                        gets = ds.storage_stats()["requests"]
                    record(storage, inflight, name, seconds, count, gets)

    print_table(
        rows,
        f"# {args.records} records in {args.shards} shards, {payload_bytes / 1e6:.1f} MB "
        f"of payload; Loader transform=None, shuffled, batch {args.batch}, "
        f"{args.threads} threads; {args.latency_ms:g} ms added to each request",
        args.csv,
    )


if __name__ == "__main__":
    main()
