"""The slice gate's cost on the train preset: the loader as shipped against every thread held.

Builds N deterministic ImageNet-sized JPEGs (500x375, quality 90, 4:2:0, the same images as
``bench_loader.py``: scikit-image's photographs with a film grain, ~84 KB a file), packs them
into shards once, and runs ``Loader(presets.train(224))`` at ``num_threads=1`` and at the
cores this process may use, each two ways:

- ``shipped``: the loader as a user gets it (the gate measures whether fewer threads build
  faster, and measures again later);
- ``held``: ``adaptive_threads=False``, every thread building at once, never measured.

Each run is a fresh loader: a few warm-up batches, then ``--epochs`` timed epochs. Rounds are
interleaved (round 1 runs every case once, then round 2, ...); the table gives medians of
images/s, the ratio shipped / held, and, from the gate's own counters
(``SliceGate.stats()``), the share of its time spent at a limit other than the one it chose
and the trials it ran. That share predicts a larger machine: the gate bounds it in wall time
whatever the core count, so on N cores a shipped run keeps at least ``1 - share`` of the held
rate (a one-thread window there builds 1/N of what an all-thread one does, losing at most its
own time); the gate's design bound is ``concurrency.BUDGET``.

``--src PATH`` imports shardfeed from another source tree (the folder holding
``shardfeed/``) to compare versions: a tree whose Loader has no ``adaptive_threads`` is held
with its gate's ``keep_all_threads()``, and its share is not counted (``-``).

    python bench/bench_gate.py [--images 1024] [--repeats 3] [--epochs 1] [--batch 64]
                               [--threads 1 2] [--data /tmp/sfgate] [--src /tmp/old/src]
                               [--csv out.csv]
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SIZE = 224
WARMUP_BATCHES = 3


def _loader(folder: Path, threads: int, held: bool, batch: int) -> Any:
    from shardfeed.dataset import Dataset
    from shardfeed.pipeline import Loader
    from shardfeed.transforms import presets

    options: dict[str, Any] = {
        "batch_size": batch, "shuffle": True, "seed": 0, "transform": presets.train(size=SIZE),
        "num_threads": threads, "prefetch_batches": 4, "drop_last": True,
    }
    ds = Dataset(str(folder / "shards"))
    if not held:
        return Loader(ds, **options)
    try:
        return Loader(ds, adaptive_threads=False, **options)
    except TypeError:  # a tree from before the option: hold its gate by hand
        loader = Loader(ds, **options)
        loader._gate.keep_all_threads()
        return loader


def run_case(folder: Path, threads: int, held: bool, args: argparse.Namespace
             ) -> dict[str, Any]:
    """One fresh loader: warm-up batches, then ``args.epochs`` timed epochs."""
    loader = _loader(folder, threads, held, args.batch)
    with loader:
        for k, _batch in enumerate(loader):
            if k + 1 == WARMUP_BATCHES:
                break
        images = 0
        start = time.perf_counter()
        for epoch in range(1, args.epochs + 1):
            loader.set_epoch(epoch)
            for batch in loader:
                images += len(batch["image/class/label"])
        seconds = time.perf_counter() - start
        gate = loader._gate
        share: float | None = None
        trials: int | None = None
        if hasattr(gate, "stats"):
            stats = gate.stats()
            share, trials = stats.off_choice_share, stats.trials
        return {"rate": images / seconds, "share": share, "trials": trials,
                "limit": gate.limit}


def _median(values: list[Any]) -> float | None:
    numbers = [v for v in values if v is not None]
    return statistics.median(numbers) if numbers else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, nargs="+", default=None,
                        help="thread counts (default: 1 and the usable cores)")
    parser.add_argument("--data", help="folder to build the data in once and reuse")
    parser.add_argument("--src", help="import shardfeed from this folder")
    parser.add_argument("--csv", help="also write the table here")
    args = parser.parse_args(argv)
    if args.src:
        sys.path.insert(0, str(Path(args.src).resolve()))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_loader import ensure_data

    import shardfeed
    from shardfeed.pipeline.concurrency import usable_cores

    cores = usable_cores()
    threads_list = args.threads or sorted({1, cores})
    print(f"shardfeed from {Path(shardfeed.__file__).parent}; {cores} usable cores", flush=True)
    with tempfile.TemporaryDirectory(prefix="shardfeed-gate-") as tmp:
        folder = ensure_data(Path(args.data) if args.data else Path(tmp), args.images)
        runs: dict[tuple[int, str], list[dict[str, Any]]] = {}
        for round_index in range(args.repeats):
            for threads in threads_list:
                for mode in ("shipped", "held"):
                    result = run_case(folder, threads, mode == "held", args)
                    runs.setdefault((threads, mode), []).append(result)
                    print(f"round {round_index + 1} threads {threads} {mode}: "
                          f"{result['rate']:.0f} img/s, limit {result['limit']}", flush=True)
    rows = []
    for threads in threads_list:
        shipped, held = runs[(threads, "shipped")], runs[(threads, "held")]
        ratios = [s["rate"] / h["rate"] for s, h in zip(shipped, held)]
        rows.append({
            "threads": threads,
            "shipped_img_s": _median([r["rate"] for r in shipped]),
            "held_img_s": _median([r["rate"] for r in held]),
            "shipped_over_held": statistics.median(ratios),
            "off_choice_share": _median([r["share"] for r in shipped]),
            "trials": _median([r["trials"] for r in shipped]),
            "final_limits": "/".join(str(r["limit"]) for r in shipped),
        })
    header = ("threads", "shipped img/s", "held img/s", "shipped/held (median of rounds)",
              "gate time off its choice", "trials", "limit at end")
    print(f"\ntrain preset {SIZE}, batch {args.batch}, {args.images} JPEGs 500x375, "
          f"{args.epochs} epoch(s) a run, median of {args.repeats}")
    print(" | ".join(header))
    for row in rows:
        share = row["off_choice_share"]
        trials = row["trials"]
        print(" | ".join([
            str(row["threads"]), f"{row['shipped_img_s']:.0f}", f"{row['held_img_s']:.0f}",
            f"{row['shipped_over_held']:.3f}",
            "-" if share is None else f"{100 * share:.2f}%",
            "-" if trials is None else f"{trials:g}", row["final_limits"],
        ]))
    if args.csv:
        with open(args.csv, "w", newline="") as out:
            writer = csv.DictWriter(out, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
