"""shardfeed against its peers in one run: decode limit, shardfeed, tf.data, torch DataLoader+PIL.

All contenders read the same 5,000 ImageNet-sized JPEGs (500x375, q90, ~84 KB, synthetic
from scikit-image's photographs, deterministic; built once by bench/bench_loader.py's
``ensure_data`` and cached under bench/data/) and produce 224x224 uint8 batches of 64 with a
random resized crop and a flip, on 2 threads:

- ``decode``     full decode of the same files (simplejpeg, bytes in memory), 2 threads: the
                 decode limit (bench_loader.py's contender);
- ``shardfeed``  Loader + presets.train(224), batch 64, 2 threads (bench_loader.py's);
- ``tf.data``    TFRecordDataset over shardfeed's shards + parse + decode_and_crop_jpeg with
                 a random crop window + resize + flip, AUTOTUNE, shuffle(10000), batch 64
                 (bench/peers/tfdata_loader.py, run in the bench-only TensorFlow environment;
                 it first checks that tf.data reads every record of our shards unchanged);
- ``torch-pil``  torch DataLoader(num_workers=2) over the .jpg files, PIL decode + crop
                 (bench_loader.py's).

Each contender runs in its own subprocess (its own peak RSS; workers' peak RSS separately),
rounds interleaved (round 1 runs every contender once, then round 2, ...), and the table gives
the median over rounds. Ratios are medians over rounds of per-round ratios, so that load from
other processes, which drifts between rounds, cancels. The CSV is printed and written to
bench/results/.

    python bench/run_loader_comparison.py [--images 5000] [--repeats 3] [--threads 2]
        [--tf-python /tmp/tfenv/bin/python] [--only decode shardfeed tf.data torch-pil]

Create the TensorFlow environment with bench/peers/make_tfenv.sh if it is missing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import bench_loader

CONTENDERS = ("decode", "shardfeed", "tf.data", "torch-pil")
TARGETS = {"vs_decode": 1.0, "vs_tfdata": 1.3, "rss_mib": 400.0}


# Linux carries a parent's peak RSS into a forked child's ru_maxrss, so this driver never
# holds the data itself: it is built and summarised in subprocesses, and the driver stays
# smaller than any contender.
_PREPARE = """
import json, statistics, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import bench_loader
from shardfeed.dataset import Dataset
folder = bench_loader.ensure_data(Path(sys.argv[2]), int(sys.argv[3]))
labels, sizes = [], []
with Dataset(str(folder / "shards")) as ds:
    for start in range(0, len(ds), 256):
        for r in ds.read_many(range(start, min(len(ds), start + 256))):
            labels.append(int(r["image/class/label"][0]))
            sizes.append(len(r["image/encoded"]))
print(json.dumps({"folder": str(folder), "records": len(labels), "label_sum": sum(labels),
                  "mean_kb": statistics.mean(sizes) / 1000}))
"""


def _prepare(folder: Path, count: int) -> dict[str, Any]:
    """Build the JPEGs once (in a subprocess) and return their record count, label sum and
    mean size, read with shardfeed."""
    done = subprocess.run(
        [sys.executable, "-c", _PREPARE, str(BENCH), str(folder), str(count)],
        capture_output=True, text=True, check=False,
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"building the data failed:\n{done.stderr[-3000:]}")
    facts: dict[str, Any] = json.loads(lines[-1])
    return facts


def peak_rss_mib() -> float:
    """This process's peak RSS (VmHWM; ru_maxrss on Linux also counts the parent's peak)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(name: str, folder: Path, threads: int) -> None:
    """Run one of bench_loader.py's contenders for one timed epoch and print JSON.

    Besides images/s it reports the process CPU time per image over the timed epoch: the
    contenders read ``time.perf_counter()`` right before and right after the epoch, and this
    wrapper notes ``time.process_time()`` at each of those calls. On a machine shared with
    other work, CPU per image is the figure that load does not distort. (torch-pil decodes in
    worker processes, whose CPU this does not see: it gets none.)
    """
    import time as time_module

    marks: list[tuple[float, float]] = []
    real_counter = time_module.perf_counter

    class _Clock:
        def __getattr__(self, attr: str) -> Any:
            return getattr(time_module, attr)

        @staticmethod
        def perf_counter() -> float:
            now = real_counter()
            marks.append((now, time_module.process_time()))
            return now

    bench_loader.time = _Clock()  # type: ignore[assignment]
    runner = bench_loader.CONTENDERS[name]
    images, seconds, cpu_seconds = runner(
        folder, argparse.Namespace(threads=threads, images=0, repeats=1)
    )
    cpu = None
    if cpu_seconds is not None:  # the contender's own measure: CPU of this process, timed epoch
        cpu = cpu_seconds * 1000 / images
    elif name != "torch-pil" and len(marks) >= 2:
        cpu = (marks[-1][1] - marks[-2][1]) * 1000 / images
    print(json.dumps({"name": name, "images": images, "rate": images / seconds,
                      "cpu_ms_per_image": cpu, "rss_mib": peak_rss_mib(),
                      "children_rss_mib": _children_rss_mib()}))
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown (worker pools) after the figures are out


def _children_rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def _child(name: str, folder: Path, args: argparse.Namespace, facts: dict[str, Any]
           ) -> dict[str, Any] | None:
    if name == "tf.data":
        command = [args.tf_python, str(BENCH / "peers" / "tfdata_loader.py"),
                   "--shards", str(folder / "shards"), "--threads", str(args.threads),
                   "--records", str(facts["records"]), "--label-sum", str(facts["label_sum"])]
    else:
        command = [sys.executable, __file__, "--child", name, "--folder", str(folder),
                   "--threads", str(args.threads)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        sys.stderr.write(f"{name} failed (exit {done.returncode}):\n{done.stderr[-3000:]}\n")
        return None
    result: dict[str, Any] = json.loads(lines[-1])
    result["name"] = name
    result["wall_s"] = time.perf_counter() - start
    return result


def _ratio(runs: dict[str, list[dict[str, Any]]], name: str, base: str) -> float:
    by_round = {r["round"]: r["rate"] for r in runs.get(base, [])}
    values = [r["rate"] / by_round[r["round"]] for r in runs.get(name, [])
              if r["round"] in by_round]
    return statistics.median(values) if values else float("nan")


def _median_or_nan(values: list[float | None]) -> float:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=list(CONTENDERS), choices=CONTENDERS)
    parser.add_argument("--data", default=str(BENCH / "data" / "loader-comparison"),
                        help="folder the JPEGs are built in once and reused from")
    parser.add_argument("--tf-python", default="/tmp/tfenv/bin/python",
                        help="Python of the environment with tensorflow-cpu")
    parser.add_argument("--csv", default=str(BENCH / "results" / "loader_comparison.csv"),
                        help="where to write the CSV (also printed)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, Path(args.folder), args.threads)
        return 0
    if "tf.data" in args.only and not os.access(args.tf_python, os.X_OK):
        sys.stderr.write(
            f"{args.tf_python} not found: create the TensorFlow environment with "
            f"bench/peers/make_tfenv.sh, pass --tf-python, or leave tf.data out with --only\n"
        )
        return 2

    folder = Path(args.data)
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    facts = _prepare(folder, args.images)
    folder = Path(facts["folder"])
    sys.stderr.write(f"data: {facts['records']} JPEGs, mean {facts['mean_kb']:.1f} KB, in "
                     f"{folder} ({time.perf_counter() - started:.0f} s)\n")

    runs: dict[str, list[dict[str, Any]]] = {}
    tf_reads_ok: bool | None = None
    for round_index in range(args.repeats):
        for name in args.only:
            result = _child(name, folder, args, facts)
            if result is None:
                continue
            result["round"] = round_index
            runs.setdefault(name, []).append(result)
            if name == "tf.data":
                tf_reads_ok = bool(result["reads_ok"]) and (tf_reads_ok is not False)
            sys.stderr.write(f"round {round_index + 1}: {name:<10} {result['rate']:8.1f} "
                             f"images/s, peak RSS {result['rss_mib']:.0f} MiB\n")

    mpix = bench_loader.WIDTH * bench_loader.HEIGHT / 1e6
    rows = []
    for name in args.only:
        results = runs.get(name)
        if not results:
            continue
        rows.append({
            "name": name, "rate": statistics.median(r["rate"] for r in results),
            "rates": [r["rate"] for r in results],
            "vs_decode": _ratio(runs, name, "decode"),
            "cpu_ms": _median_or_nan([r.get("cpu_ms_per_image") for r in results]),
            "rss_mib": max(r["rss_mib"] for r in results),
            "children_rss_mib": max(r.get("children_rss_mib", 0.0) for r in results),
        })
    print(f"{facts['records']} JPEGs {bench_loader.WIDTH}x{bench_loader.HEIGHT} q90 "
          f"(mean {facts['mean_kb']:.1f} KB), output {bench_loader.SIZE}x{bench_loader.SIZE} "
          f"uint8, batch {bench_loader.BATCH}, {args.threads} threads/workers, median of "
          f"{args.repeats} interleaved rounds, {os.cpu_count()} CPUs")
    print(f"{'contender':<10} {'images/s':>9} {'MPix/s':>7} {'vs decode':>9} {'CPU ms/img':>10} "
          f"{'RSS MiB':>8} {'workers RSS':>11}  rounds (images/s)")
    for r in rows:
        rounds = " ".join(f"{x:.0f}" for x in r["rates"])
        print(f"{r['name']:<10} {r['rate']:>9.1f} {r['rate'] * mpix:>7.1f} "
              f"{r['vs_decode']:>9.2f} {r['cpu_ms']:>10.2f} {r['rss_mib']:>8.0f} "
              f"{r['children_rss_mib']:>11.0f}  {rounds}")
    vs_decode = _ratio(runs, "shardfeed", "decode")
    vs_tf = _ratio(runs, "shardfeed", "tf.data")
    vs_torch = _ratio(runs, "shardfeed", "torch-pil")
    cpu = {r["name"]: r["cpu_ms"] for r in rows}
    cpu_vs_decode = cpu.get("decode", math.nan) / cpu.get("shardfeed", math.nan)
    cpu_vs_tf = cpu.get("tf.data", math.nan) / cpu.get("shardfeed", math.nan)
    sf_rss = max((r["rss_mib"] for r in runs.get("shardfeed", [])), default=float("nan"))
    print()
    print("                          wall clock   CPU per image (load-independent)")
    print(f"shardfeed / decode limit: {vs_decode:>10.2f}   {cpu_vs_decode:>6.2f}   "
          f"(target >= {TARGETS['vs_decode']:.1f})")
    print(f"shardfeed / tf.data:      {vs_tf:>10.2f}   {cpu_vs_tf:>6.2f}   "
          f"(target >= {TARGETS['vs_tfdata']:.1f})")
    print(f"shardfeed / torch-pil:    {vs_torch:>10.2f}")
    print(f"shardfeed peak RSS:       {sf_rss:.0f} MiB (target <= {TARGETS['rss_mib']:.0f})")
    if tf_reads_ok is not None:
        print(f"tf.data reads shardfeed's shards unchanged: {'yes' if tf_reads_ok else 'NO'} "
              f"({facts['records']} records, labels agree)")
    print()
    csv = [("contender,images_per_s,mpix_per_s,ratio_to_decode,cpu_ms_per_image,peak_rss_mib,"
            "children_peak_rss_mib,rounds")]
    for r in rows:
        csv.append(f"{r['name']},{r['rate']:.1f},{r['rate'] * mpix:.2f},{r['vs_decode']:.3f},"
                   f"{r['cpu_ms']:.3f},{r['rss_mib']:.0f},{r['children_rss_mib']:.0f},"
                   f"{' '.join(f'{x:.1f}' for x in r['rates'])}")
    csv.append(f"shardfeed/tf.data,{vs_tf:.3f},,{cpu_vs_tf:.3f},,,,")
    csv.append(f"shardfeed/decode,{vs_decode:.3f},,{cpu_vs_decode:.3f},,,,")
    print("\n".join(csv))
    if args.csv:
        Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
        Path(args.csv).write_text("\n".join(csv) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
