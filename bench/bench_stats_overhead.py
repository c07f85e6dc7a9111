"""What the stage accounting (``Loader.stats``) costs: the same loaders with it as shipped and
with its clocks taken out, rounds interleaved, in one run.

Two cases, the heaviest and the lightest work a sample:

    train   presets.train(224) over the node bench's JPEGs (500x375), batch 64
    png28   28x28 grey PNGs decoded whole (the compiled slices), batch 256

"off" replaces the slice's timing wrapper by the build it wraps, the stage clock's ``add`` by
a no-op, and hands the pass's iterator out without the consumer's clock (the few clock reads
left inside a slice's phases stay: an upper bound on the gain)::

    .venv/bin/python bench/bench_stats_overhead.py [--rounds 5] [--seconds 3] [--data DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_node  # the node bench's data


@contextlib.contextmanager
def clocks_off() -> Iterator[None]:
    from shardfeed.pipeline import loader as loader_module
    from shardfeed.pipeline import produce, stage_stats

    saved = (produce.SliceBuilder.build_slice, stage_stats.StageClock.add, loader_module.Timed)
    produce.SliceBuilder.build_slice = produce.SliceBuilder._build_slice  # type: ignore[method-assign]
    stage_stats.StageClock.add = lambda self, stage, seconds: None  # type: ignore[method-assign]
    loader_module.Timed = lambda inner, clock, after=None: inner  # type: ignore[assignment,misc]
    try:
        yield
    finally:
        (produce.SliceBuilder.build_slice, stage_stats.StageClock.add,
         loader_module.Timed) = saved  # type: ignore[method-assign,assignment]


def rate(case: str, root: Path, seconds: float) -> float:
    from shardfeed.dataset import Dataset
    from shardfeed.pipeline import Loader
    from shardfeed.transforms import DecodeImage, presets

    if case == "train":
        loader = Loader(Dataset(str(root / "jpeg500")), batch_size=64, shuffle=True, seed=0,
                        transform=presets.train(size=224), num_threads=2, drop_last=True)
    else:
        loader = Loader(Dataset(str(root / "png28")), batch_size=256, shuffle=True, seed=0,
                        transform=DecodeImage(channels="gray"), num_threads=2, drop_last=True)
    with loader:
        batches = bench_node.endless(loader, bench_node._labels)
        for _ in range(3):
            next(batches)
        items, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            items += next(batches)
        return items / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--data", help="folder for the generated data (kept between runs)")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        root = Path(args.data) if args.data else Path(stack.enter_context(
            tempfile.TemporaryDirectory()))
        if not (root / "built").exists():
            bench_node.build_data(root, bench_node.Sizes.quick(), threads=2)
            (root / "built").write_text("ok")
        print("case    on (items/s)  off (items/s)  on/off   rounds on | off")
        for case in ("train", "png28"):
            on: list[float] = []
            off: list[float] = []
            for _ in range(args.rounds):
                on.append(rate(case, root, args.seconds))
                with clocks_off():
                    off.append(rate(case, root, args.seconds))
            a, b = statistics.median(on), statistics.median(off)
            print(f"{case:<7} {a:>12,.0f} {b:>14,.0f}  {a / b:6.3f}   "
                  f"{' '.join(f'{x:,.0f}' for x in on)} | {' '.join(f'{x:,.0f}' for x in off)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
