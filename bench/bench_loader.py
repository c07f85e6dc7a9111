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

Then, per thread count, a *paired* run: one process alternates decode-limit runs and loader
epochs a second apart and prints the median ratio of each pair. On a machine shared with other
work this ratio is far steadier than one between subprocesses run tens of seconds apart.

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


Timing = tuple[int, float, "float | None"]
"""Images, wall seconds and CPU seconds of this process (None where the work runs in other
processes) of one timed run."""


def _decode_rate(payloads: list[bytes], threads: int, **settings: bool) -> Timing:
    import simplejpeg

    def decode(data: bytes) -> Any:
        return simplejpeg.decode_jpeg(data, colorspace="RGB", **settings)

    with ThreadPoolExecutor(threads) as pool:
        for _ in pool.map(decode, payloads[: 16 * threads]):  # warm-up
            pass
        start, cpu = time.perf_counter(), time.process_time()
        for _ in pool.map(decode, payloads, chunksize=16):
            pass
        return len(payloads), time.perf_counter() - start, time.process_time() - cpu


def run_decode(folder: Path, args: argparse.Namespace) -> Timing:
    return _decode_rate(_payloads(folder), args.threads)


def run_decode_as_loader(folder: Path, args: argparse.Namespace) -> Timing:
    return _decode_rate(
        _payloads(folder), args.threads, fastdct=True, fastupsample=_loader_fast_upsample()
    )


def _loader_fast_upsample() -> bool:
    """The ``fast_upsample`` setting of ``presets.train()`` (False where it has none)."""
    from shardfeed.transforms import presets

    pipeline = presets.train(size=SIZE)
    return bool(getattr(next(iter(pipeline)), "fast_upsample", False))


def _train_loader(folder: Path, threads: int) -> Any:
    from shardfeed.dataset import Dataset
    from shardfeed.pipeline import Loader
    from shardfeed.transforms import presets

    loader = Loader(
        Dataset(str(folder / "shards")), batch_size=BATCH, shuffle=True, seed=0,
        transform=presets.train(size=SIZE), num_threads=threads, prefetch_batches=4,
        drop_last=True,
    )
    for k, _batch in enumerate(loader):  # warm-up: threads started, buffers touched
        if k + 1 == WARMUP_BATCHES:
            break
    return loader


def _loader_epoch(loader: Any, epoch: int) -> Timing:
    loader.set_epoch(epoch)
    images = 0
    start, cpu = time.perf_counter(), time.process_time()
    for batch in loader:
        images += len(batch["image/class/label"])
    return images, time.perf_counter() - start, time.process_time() - cpu


def run_shardfeed(folder: Path, args: argparse.Namespace) -> Timing:
    loader = _train_loader(folder, args.threads)
    result = _loader_epoch(loader, 1)
    loader.close()
    return result


def run_paired(folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Ratios measured in one process: the loader's epoch between two decode-limit runs
    (default settings, then the loader's settings; the order alternates), ``repeats`` times.
    Each ratio compares runs a second apart, so a change of load from other processes hits
    both sides (separate subprocesses are tens of seconds apart)."""
    payloads = _payloads(folder)
    loader = _train_loader(folder, args.threads)
    fast = {"fastdct": True, "fastupsample": _loader_fast_upsample()}
    vs_full, vs_same = [], []
    for k in range(args.repeats):
        settings: list[dict[str, bool]] = [{}, fast] if k % 2 == 0 else [fast, {}]
        before = _decode_rate(payloads, args.threads, **settings[0])
        images, seconds, _cpu = _loader_epoch(loader, k + 1)
        after = _decode_rate(payloads, args.threads, **settings[1])
        rate = images / seconds
        full, same = (before, after) if k % 2 == 0 else (after, before)
        vs_full.append(rate / (full[0] / full[1]))
        vs_same.append(rate / (same[0] / same[1]))
    loader.close()
    return {"vs_full": vs_full, "vs_same": vs_same}


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


def run_torch_pil(folder: Path, args: argparse.Namespace) -> Timing:
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
    return images, seconds, None  # the work runs in the worker processes


CONTENDERS: dict[str, Callable[[Path, argparse.Namespace], Timing]] = {
    "decode": run_decode,
    "decode-as-loader": run_decode_as_loader,
    "shardfeed": run_shardfeed,
    "torch-pil": run_torch_pil,
}
OTHER = "shardfeed@other"
PAIRED = "paired"
PAIRED_OTHER = "paired@other"


# -- driver ---------------------------------------------------------------------------------------


def child(name: str, folder: Path, args: argparse.Namespace) -> None:
    """Run one contender for one timed epoch; print JSON with the rate and peak RSS."""
    if name in (PAIRED, PAIRED_OTHER):
        print(json.dumps({"name": name, **run_paired(folder, args)}))
        sys.stdout.flush()
        os._exit(0)
    runner = CONTENDERS["shardfeed" if name == OTHER else name]
    images, seconds, cpu = runner(folder, args)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak_children_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    import shardfeed

    print(json.dumps({
        "name": name, "images": images, "rate": images / seconds,
        "cpu_us": None if cpu is None else cpu / images * 1e6,
        "cores": None if cpu is None else cpu / seconds,
        "rss_mib": peak_kib / 1024, "children_rss_mib": peak_children_kib / 1024,
        "package": os.path.dirname(shardfeed.__file__),
    }))
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown (worker pools) after the figures are out


def _run_child(name: str, threads: int, folder: Path, args: argparse.Namespace
               ) -> dict[str, Any] | None:
    env = dict(os.environ)
    if name in (OTHER, PAIRED_OTHER):
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (args.other_src, env.get("PYTHONPATH", "")) if p
        )
    command = [sys.executable, __file__, "--child", name, "--folder", str(folder),
               "--threads", str(threads), "--repeats", str(args.repeats)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        sys.stderr.write(f"{name} ({threads} threads) failed:\n{done.stderr[-3000:]}\n")
        return None
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _median_or_nan(values: list[float | None]) -> float:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else math.nan


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
        paired: list[tuple[str, int, dict[str, Any]]] = []
        for threads in args.threads:
            for name in [PAIRED, PAIRED_OTHER] if args.other_src else [PAIRED]:
                if "shardfeed" in names:
                    result = _run_child(name, threads, folder, args)
                    if result is not None:
                        paired.append((name, threads, result))

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
            "cpu_us": _median_or_nan([r["cpu_us"] for r in results]),
            "cores": _median_or_nan([r["cores"] for r in results]),
        })
    cpu_limit = {r["threads"]: r["cpu_us"] for r in rows if r["name"] == "decode"}
    mpix = WIDTH * HEIGHT / 1e6
    print(f"{args.images} JPEGs {WIDTH}x{HEIGHT} q90, output {SIZE}x{SIZE} uint8, batch {BATCH}, "
          f"median of {args.repeats} interleaved epochs, {os.cpu_count()} CPUs; 'vs ...' = "
          "median over rounds of images/s / that decode limit in the same round and thread count")
    print("CPU us/img: CPU time of the contender's process per image (all its threads);"
          " 'decode CPU/CPU': the decode limit's CPU per image / this one's (1.00 = as little"
          " work per image as a bare decode; independent of how much of the machine it got);"
          " cores: CPU seconds / wall seconds")
    print(f"{'contender':<18} {'thr':>3} {'images/s':>9} {'MPix/s':>7} {'vs decode':>9} "
          f"{'vs dec-as-ld':>12} {'CPU us/img':>10} {'decode CPU/CPU':>14} {'cores':>5} "
          f"{'RSS MiB':>8} {'workers RSS':>11}  rounds")
    header = ("contender,threads,images_per_s,mpix_per_s,ratio_to_decode,"
              "ratio_to_decode_as_loader,cpu_us_per_image,decode_cpu_ratio,cores_busy,"
              "peak_rss_mib,children_peak_rss_mib")
    csv = [header]
    for r in sorted(rows, key=lambda r: (r["threads"], names.index(r["name"]))):
        full, same = r["vs_full"], r["vs_same"]
        rounds = " ".join(f"{x:.0f}" for x in r["rates"])
        work = cpu_limit.get(r["threads"], math.nan) / r["cpu_us"]
        print(f"{r['name']:<18} {r['threads']:>3} {r['rate']:>9.1f} {r['rate'] * mpix:>7.1f} "
              f"{full:>9.2f} {same:>12.2f} {r['cpu_us']:>10.0f} {work:>14.2f} "
              f"{r['cores']:>5.2f} {r['rss_mib']:>8.0f} {r['children_rss_mib']:>11.0f}  {rounds}")
        csv.append(f"{r['name']},{r['threads']},{r['rate']:.1f},{r['rate'] * mpix:.2f},"
                   f"{full:.3f},{same:.3f},{r['cpu_us']:.0f},{work:.3f},{r['cores']:.2f},"
                   f"{r['rss_mib']:.0f},{r['children_rss_mib']:.0f}")
    print()
    print("\n".join(csv))
    if paired:
        print()
        print(f"paired, in one process: shardfeed's epoch between decode-limit runs, {args.repeats}"
              " times; median ratio (each pair)")
        print(f"{'contender':<18} {'thr':>3} {'vs decode':>9} {'vs dec-as-ld':>12}  pairs")
        for name, threads, result in paired:
            label = "shardfeed" if name == PAIRED else OTHER
            each = " ".join(f"{a:.2f}/{b:.2f}" for a, b in zip(result["vs_full"], result["vs_same"]))
            print(f"{label:<18} {threads:>3} {statistics.median(result['vs_full']):>9.2f} "
                  f"{statistics.median(result['vs_same']):>12.2f}  {each}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
