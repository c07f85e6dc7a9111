"""Loader throughput against the decode limit and a torch DataLoader + PIL baseline.

Builds N deterministic ImageNet-sized JPEGs (~500x375, quality 90, cut from scikit-image's
bundled photographs), packs them into shards with ShardWriter (and, for the torch baseline,
also writes them as plain .jpg files), then runs every contender in its own subprocess (so
each peak RSS is its own) and prints a table and CSV: median images/s of 3 epochs, source
megapixels/s, the ratio to the decode limit measured in the same run, and peak RSS.

Contenders (one function each in CONTENDERS; add e.g. a tf.data one with the same signature
``(folder, args) -> (images, seconds)`` for one epoch and register it):

- ``decode-2t``: the binding's full decode (simplejpeg) of the same files on 2 threads,
  encoded bytes already in memory: the ceiling of any decode-bound pipeline.
- ``shardfeed``: Loader + presets.train(size=224), batch 64, uint8, 2 threads, shuffled.
- ``torch-pil``: torch DataLoader(num_workers=2, batch 64, shuffled) over the .jpg files,
  PIL decode + RandomResizedCrop + flip written with PIL and NumPy (no torchvision).

    python bench/bench_loader.py [--images 384] [--repeats 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

WIDTH, HEIGHT = 500, 375
SIZE = 224
BATCH = 64


# -- data -----------------------------------------------------------------------------------------


def make_jpegs(count: int) -> list[bytes]:
    """``count`` deterministic 500x375 q90 JPEGs cut from scikit-image's colour photos."""
    import cv2
    import simplejpeg
    from skimage import data

    photos = [data.astronaut(), data.chelsea(), data.coffee(), data.rocket()]
    rng = np.random.Generator(np.random.Philox(7))
    out = []
    for i in range(count):
        photo = photos[i % len(photos)]
        ph, pw = photo.shape[:2]
        ch, cw = int(ph * rng.uniform(0.5, 1.0)), int(pw * rng.uniform(0.5, 1.0))
        y, x = int(rng.integers(0, ph - ch + 1)), int(rng.integers(0, pw - cw + 1))
        crop = np.ascontiguousarray(photo[y : y + ch, x : x + cw])
        image = cv2.resize(crop, (WIDTH, HEIGHT), interpolation=cv2.INTER_AREA)
        out.append(bytes(simplejpeg.encode_jpeg(image, quality=90, colorsubsampling="420")))
    return out


def build(folder: Path, count: int, *, shards: int = 4) -> None:
    from shardfeed.format.writer import ShardWriter

    jpegs = make_jpegs(count)
    (folder / "shards").mkdir(parents=True)
    (folder / "files").mkdir()
    bounds = np.linspace(0, count, shards + 1).astype(int)
    for s in range(shards):
        with ShardWriter(str(folder / "shards" / f"train-{s:05d}.tfrecord")) as writer:
            for i in range(bounds[s], bounds[s + 1]):
                writer.write_example({
                    "image/encoded": jpegs[i], "image/format": b"jpeg",
                    "image/height": [HEIGHT], "image/width": [WIDTH],
                    "image/class/label": [i % 1000],
                    "image/filename": f"{i:06d}.jpg".encode(),
                })
    for i, jpeg in enumerate(jpegs):
        (folder / "files" / f"{i:06d}_{i % 1000}.jpg").write_bytes(jpeg)


# -- contenders: (folder, args) -> (images, seconds) for one epoch ---------------------------------


def run_decode(folder: Path, args: argparse.Namespace, epoch: int) -> tuple[int, float]:
    import simplejpeg

    from shardfeed.dataset import Dataset

    ds = Dataset(str(folder / "shards"))
    payloads = [r["image/encoded"] for r in ds.read_many(list(range(len(ds))))]
    with ThreadPoolExecutor(args.threads) as pool:
        start = time.perf_counter()
        for _ in pool.map(lambda b: simplejpeg.decode_jpeg(b, colorspace="RGB"), payloads,
                          chunksize=16):
            pass
        return len(payloads), time.perf_counter() - start


_LOADER: dict[str, Any] = {}


def run_shardfeed(folder: Path, args: argparse.Namespace, epoch: int) -> tuple[int, float]:
    from shardfeed.dataset import Dataset
    from shardfeed.pipeline import Loader
    from shardfeed.transforms import presets

    if "loader" not in _LOADER:
        _LOADER["loader"] = Loader(
            Dataset(str(folder / "shards")), batch_size=BATCH, shuffle=True, seed=0,
            transform=presets.train(size=SIZE), num_threads=args.threads, prefetch_batches=4,
            drop_last=True,
        )
    loader = _LOADER["loader"]
    loader.set_epoch(epoch)
    images = 0
    start = time.perf_counter()
    for batch in loader:
        images += len(batch["image/class/label"])
    return images, time.perf_counter() - start


class _PilFiles:
    """A torch map-style dataset of .jpg files with PIL RandomResizedCrop + flip."""

    def __init__(self, folder: Path) -> None:
        self.paths = sorted(str(p) for p in (folder / "files").glob("*.jpg"))

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        import random

        import torch
        from PIL import Image

        path = self.paths[i]
        with Image.open(path) as im:
            image = im.convert("RGB")
        width, height = image.size
        area = width * height
        box = (0, 0, width, height)
        for _ in range(10):  # torchvision's RandomResizedCrop box rule
            target = area * random.uniform(0.08, 1.0)
            ratio = math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3)))
            w = round(math.sqrt(target * ratio))
            h = round(math.sqrt(target / ratio))
            if 0 < w <= width and 0 < h <= height:
                x = random.randint(0, width - w)
                y = random.randint(0, height - h)
                box = (x, y, x + w, y + h)
                break
        image = image.resize((SIZE, SIZE), Image.BILINEAR, box=box)
        array = np.asarray(image)
        if random.random() < 0.5:
            array = array[:, ::-1]
        label = int(Path(path).stem.split("_")[1])
        return torch.from_numpy(np.ascontiguousarray(array)), label


def run_torch_pil(folder: Path, args: argparse.Namespace, epoch: int) -> tuple[int, float]:
    import torch
    from torch.utils.data import DataLoader

    if "torch" not in _LOADER:
        generator = torch.Generator()
        generator.manual_seed(0)
        _LOADER["torch"] = DataLoader(
            _PilFiles(folder), batch_size=BATCH, shuffle=True, num_workers=args.threads,
            drop_last=True, persistent_workers=True, prefetch_factor=4, generator=generator,
        )
    loader = _LOADER["torch"]
    images = 0
    start = time.perf_counter()
    for images_batch, _labels in loader:
        images += len(images_batch)
    return images, time.perf_counter() - start


CONTENDERS: dict[str, Callable[[Path, argparse.Namespace, int], tuple[int, float]]] = {
    "decode-2t": run_decode,
    "shardfeed": run_shardfeed,
    "torch-pil": run_torch_pil,
}


# -- driver ---------------------------------------------------------------------------------------


def child(name: str, folder: Path, args: argparse.Namespace) -> None:
    """Run one contender for ``repeats`` epochs; print JSON with the median rate and peak RSS."""
    rates = []
    images = 0
    for epoch in range(args.repeats):
        images, seconds = CONTENDERS[name](folder, args, epoch)
        rates.append(images / seconds)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for made in _LOADER.values():  # stop worker processes so that their peak RSS is counted
        iterator = getattr(made, "_iterator", None)
        if iterator is not None:
            iterator._shutdown_workers()
        close = getattr(made, "close", None)
        if close is not None:
            close()
    peak_children_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(json.dumps({
        "name": name, "images": images, "rate": statistics.median(rates),
        "rss_mib": peak_kib / 1024, "children_rss_mib": peak_children_kib / 1024,
    }))
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown (worker pools) after the figures are out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=384)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=list(CONTENDERS))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, Path(args.folder), args)
        return 0
    with tempfile.TemporaryDirectory(prefix="shardfeed-bench-") as tmp:
        folder = Path(tmp)
        build(folder, args.images)
        results = []
        for name in args.only:
            command = [sys.executable, __file__, "--child", name, "--folder", str(folder),
                       "--images", str(args.images), "--repeats", str(args.repeats),
                       "--threads", str(args.threads)]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
            if done.returncode != 0 or not lines:
                sys.stderr.write(f"{name} failed:\n{done.stderr[-3000:]}\n")
                continue
            results.append(json.loads(lines[-1]))
    limit = next((r["rate"] for r in results if r["name"] == "decode-2t"), float("nan"))
    mpix = WIDTH * HEIGHT / 1e6
    print(f"{args.images} JPEGs {WIDTH}x{HEIGHT} q90, output {SIZE}x{SIZE} uint8, batch {BATCH}, "
          f"{args.threads} threads/workers, median of {args.repeats} epochs, {os.cpu_count()} CPUs")
    print(f"{'contender':<12} {'images/s':>9} {'MPix/s':>8} {'vs decode':>9} {'RSS MiB':>8} "
          f"{'workers RSS MiB':>15}")
    for r in results:
        print(f"{r['name']:<12} {r['rate']:>9.1f} {r['rate'] * mpix:>8.1f} "
              f"{r['rate'] / limit:>9.2f} {r['rss_mib']:>8.0f} {r['children_rss_mib']:>15.0f}")
    print()
    print("contender,images_per_s,mpix_per_s,ratio_to_decode,peak_rss_mib,children_peak_rss_mib")
    for r in results:
        print(f"{r['name']},{r['rate']:.1f},{r['rate'] * mpix:.2f},{r['rate'] / limit:.3f},"
              f"{r['rss_mib']:.0f},{r['children_rss_mib']:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
