"""Train-preset images/s from object storage with a stated latency, against local files:
read-ahead, a disk cache as large as the data, and a cache of a quarter of it.

Writes ``--images`` ImageNet-sized JPEGs (500x375; a multiple of ``--batch``, so that an
epoch with ``drop_last`` reads every record) into ``--shards`` indexed shards,
starts an S3-compatible server in another process on 127.0.0.1 holding every request
``--latency-ms`` before answering (a cloud region's time to first byte): ``--server light``
(``bench/s3_light.py``, bodies by sendfile, so that the server does not take the decoder's
CPU) or ``moto`` (S3 in full, a Python object model a request), then runs
``presets.train(size=224)`` Loaders (``--threads`` threads, ``--batch`` a batch) for
``--epochs`` epochs each, each run in a process of its own (as a training run is), in
interleaved rounds:

* ``local``: the same files on local disk (the rate to match);
* ``s3 read-ahead``: no cache, the Loader's default read-ahead;
* ``s3 no read-ahead``: ``read_ahead=0`` (each slice waits for its own requests);
* ``s3 cache >= data``: ``Dataset(url, cache_dir=...)``, a new folder each round; its epoch
  1 fills the cache, the later epochs read it (requests for record data are counted);
* ``s3 cache 25%``: ``cache_bytes`` a quarter of the record bytes; the hit rate of the
  cache over all epochs beside the optimal policy's and LRU's for the same order
  (:mod:`shardfeed.pipeline.cache_policy`).

With ``--backends obstore s3fs`` every s3 run is made with each client side by side in the
one run (``obstore``: the default, :mod:`shardfeed.storage.obstore_backend`; ``s3fs``:
``SHARDFEED_OBSTORE=0``, fsspec's client); the client's CPU an image is the process's CPU an
image over the local run's (the same decode), and a GET's is that over the GETs an epoch
(given only where an epoch sends many small GETs: the noise is tens of µs an image).

Rates are images/s of the epochs after the first (the first of a run warms the decoder
threads; with a cache it is also the epoch that fills it). Medians over rounds.

    .venv/bin/python bench/bench_remote_cache.py [--images 2048] [--latency-ms 50]
                                                 [--backends obstore s3fs]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

SERVER = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from s3_fixture import KEY, SECRET, S3Server
os.environ.update(AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET,
                  AWS_DEFAULT_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true")
server = S3Server()
server.start()
url = server.upload_folder(sys.argv[2])
server.latency_seconds = float(sys.argv[3])
server.clear_log()
print(json.dumps({"url": url, "options": server.storage_options()}), flush=True)
for line in sys.stdin:  # "count": GETs of record bytes so far; EOF: stop
    gets = sum(1 for r in server.requests("GET") if r.path.endswith(".tfrecord"))
    print(gets, flush=True)
server.close()
"""


def photo_like(i: int, rng: np.random.Generator, yy: np.ndarray, xx: np.ndarray) -> bytes:
    """JPEG ``i`` (quality 90) of the grid ``yy, xx``: smooth colour ramps and noise."""
    import io

    from PIL import Image

    base = np.stack([(xx * (1 + i % 7)) % 256, (yy * (1 + i % 5)) % 256,
                     (xx + yy + 13 * i) % 256], axis=-1)
    noise = rng.integers(0, 48, size=base.shape)
    out = io.BytesIO()
    Image.fromarray((base + noise).clip(0, 255).astype(np.uint8)).save(
        out, format="JPEG", quality=90)
    return out.getvalue()


def write_dataset(folder: Path, images: int, shards: int) -> int:
    """ImageNet-sized JPEGs (smooth colour and noise: about 60-110 KB each); record bytes."""

    from shardfeed.format.writer import ShardWriter
    from shardfeed.tools.index import index_files

    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:375, 0:500]
    bounds = np.linspace(0, images, shards + 1).astype(int)
    total = 0

    for k in range(shards):
        with ShardWriter(str(folder / f"train-{k:05d}-of-{shards:05d}.tfrecord")) as writer:
            for i in range(bounds[k], bounds[k + 1]):
                data = photo_like(i, rng, yy, xx)
                total += len(data)
                writer.write_example({"image/encoded": data, "image/class/label": [i % 100]})
    index_files(str(folder))
    return total


def run(source: Any, *, epochs: int, args: argparse.Namespace,
        after_epoch: Any = None, **options: Any) -> tuple[list[float], Any]:
    """images/s of each epoch of a train-preset Loader over ``source`` (a Dataset)."""
    from shardfeed import Loader, presets

    rates = []
    with Loader(source, batch_size=args.batch, shuffle=True, seed=1, drop_last=True,
                num_threads=args.threads, transform=presets.train(size=224), **options) as loader:
        for _ in range(epochs):
            start = time.perf_counter()
            n = sum(len(b["image"]) for b in loader)
            rates.append(n / (time.perf_counter() - start))
            if after_epoch is not None:
                after_epoch()
    return rates, loader


class Server:
    """The S3 server in another process: ``light`` (:mod:`s3_light`, bodies by sendfile) or
    ``moto`` (S3 in full; on two cores its CPU a request competes with the decoder)."""

    def __init__(self, kind: str, root: Path, bucket: str, latency_ms: float) -> None:
        if kind == "light":
            command = [sys.executable, str(ROOT / "bench" / "s3_light.py"), str(root),
                       "--latency-ms", str(latency_ms)]
        else:
            command = [sys.executable, "-c", SERVER, str(ROOT / "tests" / "storage"),
                       str(root / bucket), str(latency_ms / 1e3)]
        self.kind = kind
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout is not None and self.proc.stdin is not None
        ready = json.loads(self.proc.stdout.readline())
        if kind == "light":
            self.url = f"s3://{bucket}"
            self.options = {"key": "bench", "secret": "bench",
                            "client_kwargs": {"endpoint_url": ready["endpoint_url"]}}
        else:
            self.url, self.options = ready["url"], ready["options"]
        self.options["config_kwargs"] = {"max_pool_connections": 64}

    def gets(self) -> int:
        """GETs of record bytes so far."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("count\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if self.kind == "light":
            return int(json.loads(answer).get("GET .tfrecord", 0))
        return int(answer)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2048)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--server", choices=("light", "moto"), default="light",
                        help="light: bench/s3_light.py (sendfile); moto: S3 in full")
    parser.add_argument("--backends", nargs="+", choices=("obstore", "s3fs"),
                        default=["obstore"],
                        help="the clients of the s3 runs, side by side in one run: obstore "
                             "(the default: storage.obstore_backend) and s3fs "
                             "(SHARDFEED_OBSTORE=0)")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # one run, in a process of its own
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case, json.loads(args.spec), args)), flush=True)
        return

    work = Path(tempfile.mkdtemp(prefix="sf-remote-cache-"))
    try:
        data = work / "buckets" / "ds"
        record_bytes = write_dataset(data, args.images, args.shards)
        server = Server(args.server, work / "buckets", "ds", args.latency_ms)
        rows: dict[str, list[float]] = {}
        cpu: dict[str, list[float]] = {}
        per_get: dict[str, list[int]] = {}
        notes: dict[str, list[Any]] = {}
        cases = [c if b == "obstore" or c == "local" else f"{c} [{b}]"
                 for b in args.backends for c in CASES if c != "local" or b == args.backends[0]]
        for r in range(args.rounds):
            for case in cases:
                spec = {"data": str(data), "url": server.url, "options": server.options,
                        "cache": str(work / f"{case}-{r}"), "quarter": record_bytes // 4}
                before = server.gets()
                out = json.loads(subprocess.run(
                    [sys.executable, __file__, *sys.argv[1:], "--case", case, "--spec",
                     json.dumps(spec)], check=True, capture_output=True, text=True).stdout)
                rows.setdefault(case, []).extend(out["rates"][1:])
                cpu.setdefault(case, []).extend(out["cpu_us"][1:])
                per_get.setdefault(case, []).extend(out["gets"][1:])
                base, _, backend = case.partition(" [")
                tag = f" [{backend}" if backend else ""
                if base == "s3 cache >= data":
                    notes.setdefault("fill GETs" + tag, []).append(out["gets"][0])
                    notes.setdefault("later-epoch GETs" + tag, []).extend(out["gets"][1:])
                    assert sum(out["gets"]) <= server.gets() - before
                if base == "s3 cache 25%" and not backend:
                    notes.setdefault("hit rate 25%", []).append(out["hits"])
            print(f"round {r + 1}: " + ", ".join(
                f"{k} {v[-1]:,.0f}" for k, v in rows.items()), file=sys.stderr, flush=True)
        server.close()
        report(rows, notes, args, record_bytes, cpu, per_get)
    finally:
        shutil.rmtree(work, ignore_errors=True)


CASES = ("local", "s3 read-ahead", "s3 no read-ahead", "s3 cache >= data", "s3 cache 25%")


def run_case(case: str, spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """One run of ``case`` (a new process: a training run), its epochs' rates and figures."""
    from shardfeed import Dataset
    from shardfeed.pipeline.cache_policy import hit_rates
    from shardfeed.storage.remote import set_storage_options

    set_storage_options("s3://", **spec["options"])
    case, _, backend = case.partition(" [")
    wants_obstore = backend.rstrip("]") != "s3fs"
    if wants_obstore:  # the default, whatever the environment says
        os.environ.pop("SHARDFEED_OBSTORE", None)
    else:
        os.environ["SHARDFEED_OBSTORE"] = "0"
    from shardfeed.storage.backends import backend_for

    chosen = backend_for(spec["url"] + "/x", spec["options"])
    if (chosen is not None and chosen.name == "obstore") != wants_obstore:
        raise SystemExit(f"case {case!r} would read through {chosen}: not the client asked")
    source, options, loader_options = spec["url"], {}, {}
    if case == "local":
        source = spec["data"]
    elif case == "s3 no read-ahead":
        loader_options = {"read_ahead": 0}
    elif case == "s3 cache >= data":
        options = {"cache_dir": spec["cache"]}
    elif case == "s3 cache 25%":
        options = {"cache_dir": spec["cache"], "cache_bytes": spec["quarter"]}
    out: dict[str, Any] = {}
    with Dataset(source, **options) as ds:
        gets: list[int] = []
        cpu_us: list[float] = []
        mark = [time.process_time()]

        def epoch_done() -> None:  # record GETs of each epoch (the client's count)
            gets.append(ds.storage_stats().get("requests", 0) - sum(gets))
            spent, mark[0] = time.process_time() - mark[0], time.process_time()
            cpu_us.append(spent / args.images * 1e6)  # the process's CPU an image

        rates, loader = run(ds, epochs=args.epochs, args=args, after_epoch=epoch_done,
                            **loader_options)
        out.update(rates=rates, gets=gets, cpu_us=cpu_us)
        if case == "s3 cache 25%":
            stats = ds.storage_stats()
            figures = hit_rates(loader, cache_bytes=spec["quarter"], epochs=range(args.epochs),
                                carried=True)
            out["hits"] = (stats["cache_hits"] / max(1, stats["cache_hits"]
                                                     + stats["cache_misses"]),
                           figures["optimal"].rate, figures["lru"].rate)
    return out


def report(rows: dict[str, list[float]], notes: dict[str, list[Any]],
           args: argparse.Namespace, record_bytes: int, cpu: dict[str, list[float]],
           per_get: dict[str, list[int]]) -> None:
    local = statistics.median(rows["local"])
    print(f"\n{args.images} JPEGs of 500x375 ({record_bytes / 1e6:.0f} MB) in {args.shards} "
          f"shards; {args.server} S3 server, {args.latency_ms:g} ms a request; "
          f"presets.train(size=224), {args.threads} threads, batch {args.batch}; epochs "
          f"2..{args.epochs} of {args.rounds} rounds, each run a process of its own\n")
    # the client's CPU: the process's CPU an image over the local run's (the same decode);
    # run-to-run noise is tens of µs an image, so a GET's share is given only where an
    # epoch sends many small GETs (no read-ahead)
    local_cpu = statistics.median(cpu["local"])
    print("| run | images/s (median) | / local | process CPU µs an image | GETs an epoch | "
          "client CPU µs a GET |\n|---|---:|---:|---:|---:|---:|")
    for name, values in rows.items():
        med = statistics.median(values)
        own = statistics.median(cpu[name])
        gets = statistics.median(per_get[name]) if per_get[name] else 0
        each = (f"{(own - local_cpu) * args.images / gets:,.0f}"
                if gets >= 200 and name != "local" else "-")
        print(f"| {name} | {med:,.0f} | {med / local:.2f} | {own:,.0f} | {gets:,.0f} | {each} |")
    for name in [n for n in notes if n.startswith("fill GETs")]:
        tag = name.removeprefix("fill GETs")
        print(f"\nrecord GETs{tag}: epoch 1 filling the cache {notes[name]}; "
              f"each later epoch {notes['later-epoch GETs' + tag]}")
    for realised, optimal, lru in notes["hit rate 25%"]:
        print(f"cache 25%: hit rate {realised:.3f}; optimal policy {optimal:.3f}; "
              f"LRU {lru:.3f}")


if __name__ == "__main__":
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    main()
