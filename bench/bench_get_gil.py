"""What a ranged GET costs the client, per client: CPU and the time the GIL is held.

On a training node a process's decoder threads and its storage calls share one GIL; the
GIL time a GET takes bounds the GETs a process can send (``1e6 / gil_us`` a second) whatever
the number of cores, and is taken from every Python step of the pipeline. It is measured
here on any machine, so two cores predict sixteen.

Writes one ``--object-mb`` object into a folder served by ``bench/s3_light.py`` (another
process, ``--latency-ms`` before each answer), then, for each client in ``--clients``, in a
process of its own and in interleaved rounds, runs ``--callers`` threads that each make
``read_ranges`` calls of ``--ranges`` random ranges of ``--range-kb`` (a shard's records of
one slice, as ``Dataset.read_many`` asks them) for ``--seconds``:

* ``obstore``: ``ObstoreSource`` (Rust ``object_store``; its requests run outside the GIL),
  the reader of ``s3://``;
* ``s3fs``: ``RemoteSource`` (fsspec's s3fs, what reads ``s3://`` with
  ``SHARDFEED_OBSTORE=0``).

Each process runs under ``py-spy record --gil`` (samples only a thread holding the GIL):
GIL-held µs a GET = samples of the reading phase / sampling rate / GETs. CPU µs a GET is
the process's user+system time over the phase / GETs (the Rust runtime's threads included).
Medians over rounds.

    .venv/bin/python bench/bench_get_gil.py [--rounds 3] [--seconds 8] [--latency-ms 5]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BUCKET = "bench"
OBJECT = "object.bin"
RATE = 1000
"""py-spy's samples a second."""


def run_case(client: str, spec: dict[str, Any]) -> dict[str, Any]:
    """The reading phase in this process: GETs, seconds and CPU seconds."""
    url = f"s3://{BUCKET}/{OBJECT}"
    options = spec["options"]
    if client == "s3fs":
        from shardfeed.storage.remote import RemoteSource

        source: Any = RemoteSource(url, storage_options=options, max_concurrency=64)
    else:
        from shardfeed.storage.obstore_backend import ObstoreSource

        source = ObstoreSource(url, storage_options=options)
    size = source.size()
    length = spec["range_kb"] << 10
    source.read_ranges([(0, length)])  # connections and signing set up before the phase
    done = threading.Event()
    counts = [0] * spec["callers"]

    def caller(k: int) -> None:
        rng = random.Random(k)
        while not done.is_set():
            ranges = [(rng.randrange(0, size - length), length) for _ in range(spec["ranges"])]
            blobs = source.read_ranges(sorted(ranges))
            assert all(len(b) == length for b in blobs)
            counts[k] += len(ranges)

    threads = [threading.Thread(target=caller, args=(k,), name=f"caller-{k}")
               for k in range(spec["callers"])]
    cpu0, began = os.times(), time.monotonic()
    for thread in threads:
        thread.start()
    time.sleep(spec["seconds"])
    done.set()
    for thread in threads:
        thread.join()
    cpu1, seconds = os.times(), time.monotonic() - began
    requests = source.stats()["requests"] - 1
    source.close()
    return {"gets": requests, "ranges": sum(counts), "seconds": seconds,
            "cpu_seconds": (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)}


def gil_samples(raw: Path) -> int:
    """py-spy's samples (GIL held) whose stack is in the reading phase: the callers'
    threads and the storage layer's (not start-up, imports or the main thread's sleep)."""
    held = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if "run_case" in stack and "caller" not in stack:
            continue  # the main thread: set-up before the phase
        if any(word in stack for word in ("caller", "storage/", "fsspec", "s3fs",
                                          "aiobotocore", "aiohttp", "obstore", "asyncio",
                                          "concurrent/futures", "threading.py")):
            held += int(count)
    return held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", nargs="+", choices=("obstore", "s3fs"),
                        default=["obstore", "s3fs"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--callers", type=int, default=2)
    parser.add_argument("--ranges", type=int, default=16)
    parser.add_argument("--range-kb", type=int, default=110)
    parser.add_argument("--object-mb", type=int, default=256)
    parser.add_argument("--latency-ms", type=float, default=5.0)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case, json.loads(args.spec))), flush=True)
        return

    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    work = Path(tempfile.mkdtemp(prefix="bench-get-gil-"))
    try:
        (work / BUCKET).mkdir()
        with open(work / BUCKET / OBJECT, "wb") as f:
            f.writelines(os.urandom(1 << 20) for _ in range(args.object_mb))
        server = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "s3_light.py"), str(work),
             "--latency-ms", str(args.latency_ms)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None and server.stdin is not None
        endpoint = json.loads(server.stdout.readline())["endpoint_url"]
        spec = {"options": {"key": "bench", "secret": "bench",
                            "client_kwargs": {"endpoint_url": endpoint,
                                              "region_name": "us-east-1"},
                            "config_kwargs": {"max_pool_connections": 64}},
                "seconds": args.seconds, "callers": args.callers, "ranges": args.ranges,
                "range_kb": args.range_kb}
        rows: dict[str, list[dict[str, float]]] = {c: [] for c in args.clients}
        for _ in range(args.rounds):
            for client in args.clients:
                raw = work / f"{client}.txt"
                out = subprocess.run(
                    [pyspy, "record", "--gil", "--threads", "--rate", str(RATE), "--format",
                     "raw", "--output", str(raw), "--nonblocking", "--", sys.executable,
                     __file__, "--case", client, "--spec", json.dumps(spec)],
                    check=True, capture_output=True, text=True).stdout
                got = json.loads(next(line for line in out.splitlines()
                                      if line.startswith("{")))
                gets = got["gets"]
                rows[client].append({
                    "gets_per_s": gets / got["seconds"],
                    "cpu_us": got["cpu_seconds"] / gets * 1e6,
                    "gil_us": gil_samples(raw) / RATE / gets * 1e6,
                })
        server.stdin.close()
        server.wait(30)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"{args.callers} callers x {args.ranges} ranges of {args.range_kb} KB, "
          f"{args.latency_ms:g} ms latency, {os.cpu_count()} cores; medians of {args.rounds}")
    print(f"{'client':10} {'GETs/s':>8} {'CPU µs/GET':>11} {'GIL µs/GET':>11} "
          f"{'GETs/s the GIL allows':>22}")
    for client, runs in rows.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"{client:10} {med['gets_per_s']:8.0f} {med['cpu_us']:11.0f} "
              f"{med['gil_us']:11.0f} {1e6 / max(med['gil_us'], 1e-9):22.0f}")


if __name__ == "__main__":
    main()
