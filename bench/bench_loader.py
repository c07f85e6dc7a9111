"""Loader throughput against the decode limit and a torch DataLoader + PIL baseline.

Builds N deterministic ImageNet-sized JPEGs (500x375, quality 90, 4:2:0, cut from
scikit-image's bundled photographs with a film grain that brings them to ImageNet's ~84 KB a
file: entropy decoding is a large part of a JPEG decode, so smooth images would flatter every
contender's per-image overheads), packs them into shards with ShardWriter (and, for the torch baseline,
also writes them as plain .jpg files), then runs every contender in its own subprocess (so
each peak RSS is its own). Repeats are interleaved: round 1 runs every contender once, then
round 2, ..., so that load from other processes hits all of them alike. Each subprocess warms
up (a few batches) and then times one whole epoch. The table and CSV give the median
images/s over the rounds, source megapixels/s, the ratio to each decode limit measured in the
same run, and the largest peak RSS over the rounds.

Contenders, for each thread count in ``--threads`` (one function each in CONTENDERS; add e.g.
a tf.data one with the same signature and register it):

- ``decode``: the binding's full decode (simplejpeg, its default settings: accurate IDCT,
  smooth upsampling) of the same files, encoded bytes already in memory, on T threads: the
  ceiling of any decode-bound pipeline.
- ``decode-as-loader``: the same with the decoder settings the loader's train preset uses
  (``fastdct=True``, ``fastupsample`` as the preset's ``fast_upsample``), so the comparison
  stays honest whichever limit one prefers.
- ``shardfeed``: Loader + presets.train(size=224), batch 64, uint8, T threads, shuffled,
  drop_last, prefetch 4. Its train preset decodes at reduced DCT scale where the crop allows,
  which is why it can beat a full decode.
- ``torch-pil``: torch DataLoader(num_workers=T, batch 64, shuffled) over the .jpg files,
  PIL decode + RandomResizedCrop + flip written with PIL and NumPy (no torchvision).

``--other-src PATH`` adds ``shardfeed@other``: the same shardfeed contender importing the
package from another source tree (``PATH`` is the folder that holds ``shardfeed/``), to
compare two versions in one interleaved run.

    python bench/bench_loader.py [--images 1024] [--repeats 3] [--threads 1 2]
                                 [--data /tmp/sfbench/data] [--other-src /tmp/old/src]
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
WARMUP_BATCHES = 3
GRAIN_SIGMA = 10.0  # luminance noise (levels): ~84 KB a 500x375 q90 JPEG, as ImageNet's


# -- data -----------------------------------------------------------------------------------------


def make_jpegs(count: int) -> list[bytes]:
    """``count`` deterministic 500x375 q90 JPEGs cut from scikit-image's colour photos, with
    a luminance grain of GRAIN_SIGMA levels (~84 KB each)."""
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
        grain = rng.normal(0.0, GRAIN_SIGMA, (HEIGHT, WIDTH, 1))
        image = np.clip(image + grain, 0, 255).astype(np.uint8)
        out.append(bytes(simplejpeg.encode_jpeg(image, quality=90, colorsubsampling="420")))
    return out


def build(folder: Path, count: int, *, shards: int = 4) -> None:
    """Write ``count`` JPEGs as shards (``folder/shards``) and as files (``folder/files``)."""
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
    (folder / "DONE").write_text(f"{count}\n")


def ensure_data(folder: Path, count: int) -> Path:
    """``folder`` holding ``count`` images, built once (a folder built for another count is
    rebuilt under ``folder/n<count>``)."""
    done = folder / "DONE"
    if done.exists() and done.read_text().strip() == str(count):
        return folder
    if done.exists() or (folder.exists() and any(folder.iterdir())):
        return ensure_data(folder / f"n{count}", count)
    build(folder, count)
    return folder


# -- contenders: (folder, args) -> (images, seconds) for one timed epoch --------------------------


def _payloads(folder: Path) -> list[bytes]:
    from shardfeed.dataset import Dataset

    ds = Dataset(str(folder / "shards"))
    return [r["image/encoded"] for r in ds.read_many(list(range(len(ds))))]


def _decode_rate(payloads: list[bytes], threads: int, **settings: bool) -> tuple[int, float]:
    import simplejpeg

    def decode(data: bytes) -> Any:
        return simplejpeg.decode_jpeg(data, colorspace="RGB", **settings)

    with ThreadPoolExecutor(threads) as pool:
        for _ in pool.map(decode, payloads[: 16 * threads]):  # warm-up
            pass
        start = time.perf_counter()
        for _ in pool.map(decode, payloads, chunksize=16):
            pass
        return len(payloads), time.perf_counter() - start


def run_decode(folder: Path, args: argparse.Namespace) -> tuple[int, float]:
    return _decode_rate(_payloads(folder), args.threads)


def run_decode_as_loader(folder: Path, args: argparse.Namespace) -> tuple[int, float]:
    return _decode_rate(
        _payloads(folder), args.threads, fastdct=True, fastupsample=_loader_fast_upsample()
    )


def _loader_fast_upsample() -> bool:
    """The ``fast_upsample`` setting of ``presets.train()`` (False where it has none)."""
    from shardfeed.transforms import presets

    pipeline = presets.train(size=SIZE)
    return bool(getattr(next(iter(pipeline)), "fast_upsample", False))


def run_shardfeed(folder: Path, args: argparse.Namespace) -> tuple[int, float]:
    from shardfeed.dataset import Dataset
    from shardfeed.pipeline import Loader
    from shardfeed.transforms import presets

    loader = Loader(
        Dataset(str(folder / "shards")), batch_size=BATCH, shuffle=True, seed=0,
        transform=presets.train(size=SIZE), num_threads=args.threads, prefetch_batches=4,
        drop_last=True,
    )
    for k, _batch in enumerate(loader):  # warm-up: threads started, buffers touched
        if k + 1 == WARMUP_BATCHES:
            break
    loader.set_epoch(1)
    images = 0
    start = time.perf_counter()
    for batch in loader:
        images += len(batch["image/class/label"])
    seconds = time.perf_counter() - start
    loader.close()
    return images, seconds


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


def run_torch_pil(folder: Path, args: argparse.Namespace) -> tuple[int, float]:
    import torch
    from torch.utils.data import DataLoader

    generator = torch.Generator()
    generator.manual_seed(0)
    loader = DataLoader(
        _PilFiles(folder), batch_size=BATCH, shuffle=True, num_workers=args.threads,
        drop_last=True, persistent_workers=True, prefetch_factor=4, generator=generator,
    )
    for k, _batch in enumerate(loader):  # warm-up: workers started
        if k + 1 == WARMUP_BATCHES:
            break
    images = 0
    start = time.perf_counter()
    for images_batch, _labels in loader:
        images += len(images_batch)
    seconds = time.perf_counter() - start
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None:  # stop the workers so that their peak RSS is counted
        iterator._shutdown_workers()
    return images, seconds


CONTENDERS: dict[str, Callable[[Path, argparse.Namespace], tuple[int, float]]] = {
    "decode": run_decode,
    "decode-as-loader": run_decode_as_loader,
    "shardfeed": run_shardfeed,
    "torch-pil": run_torch_pil,
}
OTHER = "shardfeed@other"


# -- driver ---------------------------------------------------------------------------------------


def child(name: str, folder: Path, args: argparse.Namespace) -> None:
    """Run one contender for one timed epoch; print JSON with the rate and peak RSS."""
    runner = CONTENDERS["shardfeed" if name == OTHER else name]
    images, seconds = runner(folder, args)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak_children_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    import shardfeed

    print(json.dumps({
        "name": name, "images": images, "rate": images / seconds,
        "rss_mib": peak_kib / 1024, "children_rss_mib": peak_children_kib / 1024,
        "package": os.path.dirname(shardfeed.__file__),
    }))
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown (worker pools) after the figures are out


def _run_child(name: str, threads: int, folder: Path, args: argparse.Namespace
               ) -> dict[str, Any] | None:
    env = dict(os.environ)
    if name == OTHER:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (args.other_src, env.get("PYTHONPATH", "")) if p
        )
    command = [sys.executable, __file__, "--child", name, "--folder", str(folder),
               "--threads", str(threads)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        sys.stderr.write(f"{name} ({threads} threads) failed:\n{done.stderr[-3000:]}\n")
        return None
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--only", nargs="*", default=list(CONTENDERS),
                        choices=[*CONTENDERS, OTHER])
    parser.add_argument("--data", help="folder to build the data in once and reuse")
    parser.add_argument("--other-src", help="also run shardfeed imported from this folder")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.threads = args.threads[0]
        child(args.child, Path(args.folder), args)
        return 0
    names = list(args.only)
    if args.other_src and OTHER not in names:
        names.insert(names.index("shardfeed") + 1 if "shardfeed" in names else len(names), OTHER)
    with tempfile.TemporaryDirectory(prefix="shardfeed-bench-") as tmp:
        folder = ensure_data(Path(args.data) if args.data else Path(tmp), args.images)
        runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for round_index in range(args.repeats):
            for threads in args.threads:
                for name in names:
                    result = _run_child(name, threads, folder, args)
                    if result is not None:
                        result["round"] = round_index
                        runs.setdefault((name, threads), []).append(result)
    def ratio(results: list[dict[str, Any]], limit: str, threads: int) -> float:
        """Median over rounds of rate / the limit's rate in the same round (load from other
        processes changes between rounds, less within one)."""
        base = {r["round"]: r["rate"] for r in runs.get((limit, threads), [])}
        values = [r["rate"] / base[r["round"]] for r in results if r["round"] in base]
        return statistics.median(values) if values else float("nan")

    rows = []
    for (name, threads), results in runs.items():
        rows.append({
            "name": name, "threads": threads,
            "rate": statistics.median(r["rate"] for r in results),
            "rates": [r["rate"] for r in results],
            "vs_full": ratio(results, "decode", threads),
            "vs_same": ratio(results, "decode-as-loader", threads),
            "rss_mib": max(r["rss_mib"] for r in results),
            "children_rss_mib": max(r["children_rss_mib"] for r in results),
        })
    mpix = WIDTH * HEIGHT / 1e6
    print(f"{args.images} JPEGs {WIDTH}x{HEIGHT} q90, output {SIZE}x{SIZE} uint8, batch {BATCH}, "
          f"median of {args.repeats} interleaved epochs, {os.cpu_count()} CPUs; 'vs ...' = "
          "median over rounds of images/s / that decode limit in the same round and thread count")
    print(f"{'contender':<18} {'thr':>3} {'images/s':>9} {'MPix/s':>7} {'vs decode':>9} "
          f"{'vs dec-as-ld':>12} {'RSS MiB':>8} {'workers RSS':>11}  rounds")
    header = ("contender,threads,images_per_s,mpix_per_s,ratio_to_decode,"
              "ratio_to_decode_as_loader,peak_rss_mib,children_peak_rss_mib")
    csv = [header]
    for r in sorted(rows, key=lambda r: (r["threads"], names.index(r["name"]))):
        full, same = r["vs_full"], r["vs_same"]
        rounds = " ".join(f"{x:.0f}" for x in r["rates"])
        print(f"{r['name']:<18} {r['threads']:>3} {r['rate']:>9.1f} {r['rate'] * mpix:>7.1f} "
              f"{full:>9.2f} {same:>12.2f} {r['rss_mib']:>8.0f} "
              f"{r['children_rss_mib']:>11.0f}  {rounds}")
        csv.append(f"{r['name']},{r['threads']},{r['rate']:.1f},{r['rate'] * mpix:.2f},"
                   f"{full:.3f},{same:.3f},{r['rss_mib']:.0f},"
                   f"{r['children_rss_mib']:.0f}")
    print()
    print("\n".join(csv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
